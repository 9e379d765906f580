"""The plots of ``kvserve bench trace --out DIR``, drawn from its result rows (the
``results`` of its JSON, so a saved run can be drawn again without replaying the trace):

- ``hit_rate_vs_capacity.png``: the offline LRU's, the offline leaf-first LRU's and the
  real pool's prefix hit rates (with each eviction replayed) against the capacity
  (``capacity`` rows);
- ``local_vs_shared.png``: at the largest capacity C of the cluster replay (``cluster``
  rows), one bar per router policy for each worker count N, the hit rate of N local caches
  of C/N blocks, against one horizontal line for the shared pool of C blocks (the shared
  cache sees every request in trace order whatever the placement, so every row holds the
  same shared rate; were they to differ, each group gets its own segment).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvserve.loadgen.plots import pyplot, save
from kvserve.report import log

Row = dict[str, Any]


def plot(rows: Sequence[Row], out: Path) -> list[Path]:
    """Write both plots of ``rows`` (those of their first trace, when they are of several:
    ``--traces``) into ``out``; the files written (none without matplotlib, which is
    logged)."""
    try:
        pyplot()
    except ImportError:
        log("plots skipped: matplotlib is not installed")
        return []
    first = rows[0].get("trace") if rows else None
    rows = [r for r in rows if r.get("trace", first) == first]
    files = [hit_rate_vs_capacity([r for r in rows if r["section"] == "capacity"], out)]
    cluster = [r for r in rows if r["section"] == "cluster"]
    if cluster:
        top = max(r["capacity_blocks"] for r in cluster)
        files.append(local_vs_shared([r for r in cluster if r["capacity_blocks"] == top], out))
    return files


def hit_rate_vs_capacity(caps: Sequence[Row], out: Path) -> Path:
    """The LRU's (and, where every row has them, the leaf-first LRU's and each pool
    replay's) hit rate against capacity."""
    fig, ax = pyplot().subplots(figsize=(6, 4))
    xs = [r["capacity_blocks"] for r in caps]
    ax.plot(xs, [r["lru"]["token_hit_rate"] for r in caps], "o-", label="offline LRU")
    for name, style, label in (
        ("leaf_lru", "x:", "offline leaf-first LRU"),
        ("pool", "s-", "pool, master's eviction"),
        ("pool_chain", "d-", "pool, chain-aware eviction"),
    ):
        if caps and all(name in r for r in caps):  # (a run saved before it existed lacks it)
            ax.plot(xs, [r[name]["token_hit_rate"] for r in caps], style, label=label)
    ax.set(xscale="log", xlabel="capacity (blocks)", ylabel="prefix hit rate (tokens)")
    ax.legend()
    return save(fig, out / "hit_rate_vs_capacity.png")


def local_vs_shared(cluster: Sequence[Row], out: Path) -> Path:
    """Grouped bars of the local hit rate per worker count and policy, the shared pool's
    rate once, as a line (all rows at one capacity)."""
    capacity = cluster[0]["capacity_blocks"]
    groups = sorted({r["workers"] for r in cluster})
    policies = list(dict.fromkeys(r["policy"] for r in cluster))
    width = 0.8 / len(policies)
    fig, ax = pyplot().subplots(figsize=(8.5, 4.2))
    for k, policy in enumerate(policies):
        mine = {r["workers"]: r["token_hit_rate_local"] for r in cluster if r["policy"] == policy}
        xs = [g + (k - (len(policies) - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, [mine.get(n, 0.0) for n in groups], width * 0.9, label=policy)
    shared = {r["workers"]: r["token_hit_rate_shared"] for r in cluster}
    label = f"one shared pool of {capacity} blocks"
    if len(set(shared.values())) == 1:
        ax.axhline(next(iter(shared.values())), color="black", linestyle="--", label=label)
    else:
        for g, n in enumerate(groups):
            ax.hlines(shared[n], g - 0.45, g + 0.45, colors="black", linestyles="--",
                      label=label if g == 0 else None)  # fmt: skip
    ticks = [f"N = {n} workers\n{capacity // n} blocks each" for n in groups]
    ax.set_xticks(range(len(groups)), ticks)
    ax.set(
        ylabel="prefix hit rate (tokens)",
        title=f"{capacity} blocks in all: N local caches (bars, per router policy)\n"
        "against one shared pool (line)",
    )
    ax.set_ylim(0, 1.1 * max(max(shared.values()), *(r["token_hit_rate_local"] for r in cluster)))
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    return save(fig, out / "local_vs_shared.png")

"""The plot of ``kvserve bench peer --out FILE.png``: output token throughput per server.

One panel per (model, workload); in each, a group of bars per rate, one bar per server
(vLLM first), each kvserve bar labelled with its ratio to vLLM's (``x0.62``). Rows without
a result (``error``) are left out. matplotlib (Agg) is imported only here.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvserve.bench.peer_results import BASELINE
from kvserve.loadgen.plots import pyplot, save


def _panels(rows: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    return list(dict.fromkeys((r["model"], r["workload"]) for r in rows))


def throughput_plot(rows: Sequence[dict[str, Any]], path: Path) -> Path | None:
    """Write the plot to ``path`` (PNG); None, and no file, when no row has a result."""
    good = [r for r in rows if "error" not in r and r.get("output_throughput") is not None]
    if not good:
        return None
    plt = pyplot()
    panels = _panels(good)
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 3.6 * len(panels)), squeeze=False)
    servers = list(dict.fromkeys(r["server"] for r in good))
    for ax, (model, workload) in zip(axes[:, 0], panels, strict=True):
        mine = [r for r in good if r["model"] == model and r["workload"] == workload]
        rates = list(dict.fromkeys(str(r["rate"]) for r in mine))
        width = 0.8 / len(servers)
        for k, server in enumerate(servers):
            by_rate = {str(r["rate"]): r for r in mine if r["server"] == server}
            xs = [i + (k - (len(servers) - 1) / 2) * width for i in range(len(rates))]
            ys = [(by_rate.get(rate) or {}).get("output_throughput") or 0.0 for rate in rates]
            bars = ax.bar(xs, ys, width, label=server)
            for bar, rate in zip(bars, rates, strict=True):
                ratio = ((by_rate.get(rate) or {}).get(f"vs_{BASELINE}") or {}).get(
                    "output_throughput"
                )
                if ratio is not None:
                    x = bar.get_x() + bar.get_width() / 2
                    ax.annotate(f"x{ratio:.2f}", (x, bar.get_height()), ha="center",
                                va="bottom", fontsize=7)  # fmt: skip
        ax.set_xticks(range(len(rates)), [f"rate {rate}" for rate in rates])
        ax.set_ylabel("output tokens/s")
        ax.set_title(f"{model}, {workload} (ratio: kvserve / {BASELINE})")
        ax.legend(fontsize=8)
    return save(fig, path)

"""The heatmap of ``kvserve sim ratio``: one row per mix (prompt-heavy at the top), one
column per number of prefill instances ``1 .. N-1`` and a last one for the colocated
baseline. The colour is the goodput in req/s on one logarithmic scale for the whole map
(the colour bar), the number the same goodput (``≥``: every rate passed, a lower bound); a
green outline marks the band and a star the best split.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvserve.loadgen.plots import pyplot, save


def column(row: dict[str, Any], instances: int) -> int:
    """The heatmap column of a result row: its prefill count less one, colocated last."""
    return instances - 1 if row["colocated"] else int(row["prefill"]) - 1


def grid(
    rows: Sequence[dict[str, Any]], mixes: Sequence[str], instances: int
) -> list[list[float | None]]:
    """Goodput per (mix, column), None where no row is."""
    cells: list[list[float | None]] = [[None] * instances for _ in mixes]
    for r in rows:
        cells[mixes.index(r["mix"])][column(r, instances)] = float(r["goodput_rps"])
    return cells


def colour_norm(cells: Sequence[Sequence[float | None]]) -> Any:
    """One colour scale for every cell: logarithmic from the smallest positive goodput to
    the largest (a goodput of 0 takes the lowest colour), linear when they are equal."""
    from matplotlib.colors import LogNorm, Normalize

    positive = [v for line in cells for v in line if v is not None and v > 0]
    low, high = min(positive, default=1.0), max(positive, default=1.0)
    return LogNorm(vmin=low, vmax=high, clip=True) if low < high else Normalize(0.0, high)


def colour_ticks(low: float, high: float) -> list[float]:
    """The 1-2-5 series between ``low`` and ``high`` (both ends included), for plain
    numbers on the colour bar instead of powers of ten."""
    if not 0 < low < high:
        return [low, high]
    start = 10.0 ** math.floor(math.log10(low))
    decades = range(int(math.log10(high / start)) + 2)
    series = (start * 10**k * m for k in decades for m in (1, 2, 5))
    inner = [t for t in series if low * 1.15 < t < high / 1.15]
    return [low, *inner, high]


def plot(rows: Sequence[dict[str, Any]], mixes: Sequence[str], instances: int, path: Path) -> Path:
    """Draw the heatmap of ``rows`` (``sim ratio``'s result rows) into ``path``."""
    plt = pyplot()
    cells = grid(rows, mixes, instances)
    norm = colour_norm(cells)
    floor = norm.vmin if norm.vmin > 0 else 0.0
    shade = [[math.nan if v is None else max(v, floor) for v in line] for line in cells]
    fig, ax = plt.subplots(figsize=(1.0 * instances + 2.5, 0.7 * len(mixes) + 2))
    image = ax.imshow(shade, cmap="viridis", norm=norm, aspect="auto")
    bar = fig.colorbar(image, ax=ax, label="goodput (req/s), log scale")
    ticks = colour_ticks(norm.vmin, norm.vmax)
    bar.set_ticks(ticks, labels=[f"{t:.3g}" for t in ticks])
    bar.minorticks_off()
    for r in rows:
        y, x = mixes.index(r["mix"]), column(r, instances)
        bound = "≥" if r.get("goodput_lower_bound") else ""
        ax.text(x, y, f"{bound}{r['goodput_rps']:.3g}", ha="center", va="center", fontsize=8,
                color="black" if norm(shade[y][x]) > 0.6 else "white")  # fmt: skip
        if r.get("in_band"):
            ax.add_patch(plt.Rectangle((x - 0.46, y - 0.46), 0.92, 0.92, fill=False,
                                       edgecolor="lime", linewidth=2.5))  # fmt: skip
        if r.get("best"):
            ax.plot(x + 0.3, y - 0.28, marker="*", color="red", markersize=10)
    labels = [str(p) for p in range(1, instances)] + ["colo"]
    ax.set_xticks(range(instances), labels)
    ax.set_yticks(range(len(mixes)), mixes)
    ax.set(
        xlabel=f"prefill instances of {instances} (rest decode); colo = {instances} mixed",
        ylabel="mix INPUT:OUTPUT tokens",
        title="goodput (req/s) per P:D split; green: within band of best (*)",
    )
    return save(fig, path)

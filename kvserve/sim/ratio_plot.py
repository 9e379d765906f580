"""The heatmap of ``kvserve sim ratio``: one row per mix (prompt-heavy at the top), one
column per number of prefill instances ``1 .. N-1`` and a last one for the colocated
baseline; the colour is the goodput over the mix's highest goodput in any column, the
number is the goodput in req/s (``≥``: every rate passed, a lower bound), a green outline
marks the band and a star the best split.
"""

from __future__ import annotations

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


def plot(rows: Sequence[dict[str, Any]], mixes: Sequence[str], instances: int, path: Path) -> Path:
    plt = pyplot()
    cells = grid(rows, mixes, instances)
    shade = []
    for line in cells:
        top = max((v for v in line if v is not None), default=0.0)
        shade.append([float("nan") if v is None else (v / top if top else 0.0) for v in line])
    fig, ax = plt.subplots(figsize=(1.0 * instances + 2.5, 0.7 * len(mixes) + 2))
    image = ax.imshow(shade, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
    fig.colorbar(image, ax=ax, label="goodput / mix's best")
    for r in rows:
        y, x = mixes.index(r["mix"]), column(r, instances)
        value = shade[y][x]
        bound = "≥" if r.get("goodput_lower_bound") else ""
        ax.text(x, y, f"{bound}{r['goodput_rps']:.3g}", ha="center", va="center", fontsize=8,
                color="black" if value > 0.6 else "white")  # fmt: skip
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

"""PNG plots of serving runs (matplotlib, Agg backend, imported only when a plot is drawn).

Every function takes LISTS of labelled runs, so ``bench compare`` can overlay deployments:

- :func:`latency_cdfs`: empirical CDFs of TTFT, TPOT and ITL, one line per run, on a log
  time axis (a tail ten times the median stays readable);
- :func:`attainment_vs_rate`: SLO attainment against request rate, one line per series,
  with the goodput threshold as a dashed line;
- :func:`goodput_bars`: one bar per label (e.g. DistServe goodput per deployment);
- :func:`hit_rate_vs_capacity`: cache hit rate against a capacity (e.g. pool MiB), one line
  per series.

Each writes one file and returns its path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kvserve.loadgen.metrics import RequestRecord, present

Runs = Sequence[tuple[str, Sequence[RequestRecord]]]
Series = Sequence[tuple[str, Sequence[tuple[float, float | None]]]]


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (files only, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, path: Path) -> Path:
    """Lay ``fig`` out, write it to ``path`` (folders made), close it; ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    return path


def cdf_points(values: Sequence[float]) -> tuple[list[float], list[float]]:
    """Sorted values and their empirical CDF ``(i + 1) / n``."""
    xs = sorted(values)
    return xs, [(i + 1) / len(xs) for i in range(len(xs))]


def positive_cdf_points(values: Sequence[float]) -> tuple[list[float], list[float]]:
    """:func:`cdf_points` without the points a log axis cannot show (values <= 0): they
    still count in every share."""
    points = [(x, y) for x, y in zip(*cdf_points(values), strict=True) if x > 0]
    return [x for x, _ in points], [y for _, y in points]


def latency_cdfs(runs: Runs, path: Path) -> Path:
    """One panel per metric (TTFT, TPOT, ITL), one CDF line per run, times on a log axis."""
    metrics: dict[str, Callable[[RequestRecord], Sequence[float | None]]] = {
        "TTFT": lambda r: [r.ttft_s],
        "TPOT": lambda r: [r.tpot_s],
        "ITL": lambda r: r.itl_s,
    }
    fig, axes = pyplot().subplots(1, len(metrics), figsize=(13, 4))
    for ax, (name, values_of) in zip(axes, metrics.items(), strict=True):
        for label, records in runs:
            values = present([v for r in records if r.ok for v in values_of(r)])
            if values:
                ax.plot(*positive_cdf_points(values), label=label, drawstyle="steps-post")
        ax.set_xscale("log")
        ax.set_xlabel(f"{name} (s, log scale)")
        ax.set_ylabel("share of requests" if name != "ITL" else "share of gaps")
        ax.set_title(f"{name} CDF")
        ax.grid(alpha=0.3, which="both")
    axes[0].legend(fontsize=8)
    return save(fig, path)


def line_plot(series: Series, xlabel: str, ylabel: str, title: str) -> Any:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, points in series:
        ordered = sorted((x, y) for x, y in points if y is not None)
        ax.plot([x for x, _ in ordered], [y for _, y in ordered], marker="o", label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    return fig, ax


def attainment_vs_rate(series: Series, path: Path, threshold: float = 0.9) -> Path:
    fig, ax = line_plot(series, "request rate (req/s)", "SLO attainment", "SLO attainment")
    ax.axhline(threshold, linestyle="--", color="grey", label=f"{threshold:.0%}")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=8)
    return save(fig, path)


def hit_rate_vs_capacity(series: Series, path: Path, xlabel: str = "capacity (MiB)") -> Path:
    fig, ax = line_plot(series, xlabel, "cache hit rate (tokens)", "Cache hit rate")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=8)
    return save(fig, path)


def goodput_bars(bars: Sequence[tuple[str, float | None]], path: Path, ylabel: str) -> Path:
    fig, ax = pyplot().subplots(figsize=(6, 4))
    labels = [label for label, _ in bars]
    ax.bar(labels, [value or 0.0 for _, value in bars], color="tab:blue")
    ax.set_ylabel(ylabel)
    ax.set_title("Goodput")
    ax.grid(alpha=0.3, axis="y")
    return save(fig, path)

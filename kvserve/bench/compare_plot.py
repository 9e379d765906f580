"""The plots of ``kvserve bench compare --out DIR``, and the file they are drawn from.

With ``--out``, ``bench compare`` writes ``DIR/compare_runs.json`` (:func:`save_runs`):
for each (deployment, policy) run, its attainment by rate, its goodput and the record of
every request of every rate (:class:`~kvserve.loadgen.metrics.RequestRecord`, as
``bench serve`` writes them). The plots (:func:`draw`) are drawn from that content alone,
so ``kvserve bench compare --replot DIR/compare_runs.json`` (:func:`replot`) draws them
again, with today's plotting code, without starting a cluster:

- ``attainment_vs_rate.png``: SLO attainment against the rate, one line per run;
- ``goodput.png``: the DistServe goodput of each run;
- ``latency_cdf.png``: TTFT, TPOT and ITL CDFs, one line per run and rate (log time axis).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvserve.loadgen import plots
from kvserve.loadgen.metrics import RequestRecord
from kvserve.loadgen.options import json_rate

RUNS_FILE = "compare_runs.json"


@dataclass(frozen=True)
class PlottedRun:
    """What the plots need of one (deployment, policy) run: its ``label``
    (``"1p1d cache_aware"``), ``points`` (rate, attainment), ``goodput_rps`` (None: no
    sweep) and ``rates``: each rate's label and request records."""

    label: str
    points: list[tuple[float, float | None]]
    goodput_rps: float | None
    rates: list[tuple[str, list[RequestRecord]]]


def plotted_runs(results: dict[tuple[str, str], dict[str, Any]]) -> list[PlottedRun]:
    """The runs of ``bench compare``'s results (serve results keyed by (deployment,
    policy))."""
    return [
        PlottedRun(
            label=f"{name} {policy}",
            points=[(float(x), a) for x, a in r["points"]],
            goodput_rps=None if r["sweep"] is None else r["sweep"].interpolated_rate,
            rates=[(label, list(records)) for label, records in r["runs"]],
        )
        for (name, policy), r in results.items()
    ]


def draw(out: Path, runs: Sequence[PlottedRun]) -> list[Path]:
    """The three plots of ``runs`` into ``out``; the files written."""
    out.mkdir(parents=True, exist_ok=True)
    series = [(run.label, run.points) for run in runs]
    bars = [(run.label, run.goodput_rps) for run in runs]
    cdfs = [(f"{run.label} {label}", recs) for run in runs for label, recs in run.rates]
    return [
        plots.attainment_vs_rate(series, out / "attainment_vs_rate.png"),
        plots.goodput_bars(bars, out / "goodput.png", "goodput (req/s)"),
        plots.latency_cdfs(cdfs, out / "latency_cdf.png"),
    ]


def save_runs(out: Path, runs: Sequence[PlottedRun]) -> Path:
    """Write ``out/compare_runs.json`` (module docstring); its path."""
    payload = {
        "runs": [
            {
                "label": run.label,
                "points": [[json_rate(x), a] for x, a in run.points],
                "goodput_rps": run.goodput_rps,
                "rates": [
                    {"label": label, "records": [dataclasses.asdict(r) for r in records]}
                    for label, records in run.rates
                ],
            }
            for run in runs
        ]
    }
    out.mkdir(parents=True, exist_ok=True)
    path = out / RUNS_FILE
    path.write_text(json.dumps(payload) + "\n")
    return path


def load_runs(path: Path) -> list[PlottedRun]:
    """The runs saved by :func:`save_runs` at ``path``."""
    payload = json.loads(path.read_text())
    return [
        PlottedRun(
            label=run["label"],
            points=[(float(x), a) for x, a in run["points"]],
            goodput_rps=run["goodput_rps"],
            rates=[(rate["label"], [record(r) for r in rate["records"]]) for rate in run["rates"]],
        )
        for run in payload["runs"]
    ]


def record(fields: dict[str, Any]) -> RequestRecord:
    """A :class:`RequestRecord` from its JSON (its chunk times a tuple again)."""
    return RequestRecord(**{**fields, "chunk_times_s": tuple(fields["chunk_times_s"])})


def write_plots(out: Path, results: dict[tuple[str, str], dict[str, Any]]) -> list[Path]:
    """Save the runs of ``results`` (:func:`save_runs`) and draw them into ``out``; the
    files written."""
    runs = plotted_runs(results)
    return [save_runs(out, runs), *draw(out, runs)]


def replot(saved: Path, out: Path) -> list[Path]:
    """Draw the plots of the runs saved at ``saved`` into ``out``; the files written."""
    return draw(out, load_runs(saved))

"""The changing-load scenario shared by ``kvserve bench shift`` (a live cluster) and
``kvserve sim shift`` (the simulator): its settings (:class:`ShiftConfig`, and the router's
``--controller-*`` flags with the shift's own defaults: :func:`add_shift_arguments`), the
phases and controller settings they give (:func:`phases_of`, :func:`ratio_config`), one
run's row (:func:`shift_row`), the plot of the runs over time (:func:`plot`), the
conditions (:func:`conditions_of`) and the headline (:func:`headline`); and the scenario
itself, whatever serves it: each controller mode in turn through a live cluster's or the
simulator's ``serve`` (:func:`run_scenario`). The requests themselves are
:mod:`kvserve.loadgen.shift`'s.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from kvserve.loadgen.metrics import RequestRecord, summarize
from kvserve.loadgen.options import WorkloadConfig
from kvserve.loadgen.shift import Phase, attainment_over_time, parse_phase, phase_starts
from kvserve.loadgen.slo import AbsoluteSlo, SloTargets
from kvserve.report import command, emit, log
from kvserve.settings import BENCH_ENV, add_config_args, config_from_args, setting
from router.config import CONTROLLER_PREFIX, RouterConfig
from router.control.ratio import RatioConfig

DEFAULT_PHASES = ["512:16@0.25x150", "64:128@0.2x150"]
MODES = ("off", "on")
CONTROLLER_DEFAULTS = {
    "controller_ttft_slo_s": 8.0,
    "controller_tpot_slo_s": 0.3,
    "controller_cooldown_s": 30.0,
}
"""The shift's own defaults of the controller's SLO (the benchmark's too) and cooldown."""


@dataclass(frozen=True)
class ShiftConfig:
    """The changing load of ``bench shift`` and ``sim shift``.

    - ``phases``: INPUT:OUTPUT@RATExSECONDS, in order;
    - ``spread``: lengths uniform in mean*(1±s);
    - ``seed``: seed of the requests and arrivals;
    - ``vocab``: token ids in [100, vocab);
    - ``modes``: controller off and/or on;
    - ``window_s``: attainment-over-time window;
    - ``tick_s``: attainment-over-time step;
    - ``out``: folder for the plot.
    """

    env_prefix: ClassVar[str] = BENCH_ENV
    phases: list[str] = setting(DEFAULT_PHASES)
    spread: float = WorkloadConfig.spread
    seed: int = 0
    vocab: int = 49152
    modes: list[str] = setting(list(MODES), choices=MODES)
    window_s: float = RatioConfig.window_s
    tick_s: float = 5.0
    out: Path | None = None


def add_shift_arguments(p: argparse.ArgumentParser) -> None:
    """Workload, SLO and controller flags (shared with ``kvserve sim shift``)."""
    add_config_args(p, ShiftConfig)
    add_config_args(
        p, RouterConfig, only=("controller_interval_s", "ratio"), defaults=CONTROLLER_DEFAULTS
    )


def phases_of(args: argparse.Namespace) -> list[Phase]:
    return [parse_phase(text, args.spread) for text in args.phases]


def ratio_config(args: argparse.Namespace) -> RatioConfig:
    """The controller settings of the flags (the router's ``--controller-*`` flags)."""
    return config_from_args(RatioConfig, args, CONTROLLER_PREFIX)


def slo_of(args: argparse.Namespace) -> AbsoluteSlo:
    """The benchmark's SLO is the controller's: one target for both to be judged by."""
    return AbsoluteSlo(SloTargets(args.controller_ttft_slo_s, args.controller_tpot_slo_s))


def shift_row(
    args: argparse.Namespace,
    mode: str,
    records: Sequence[RequestRecord],
    moves: list[dict[str, Any]],
) -> dict[str, Any]:
    """One run's row: attainment overall, per phase and over time, and the moves."""
    slo = slo_of(args)
    phases = phases_of(args)
    overall = summarize(records, max((r.end_s for r in records), default=0.0), slo.meets)
    per_phase = []
    for k, phase in enumerate(phases):
        mine = [r for r in records if r.group == k]
        s = summarize(mine, phase.duration_s, slo.meets)
        per_phase.append(
            {
                "phase": phase.label,
                "requests": s.requests,
                "slo_attainment": s.slo_attainment,
                "ttft_p90_s": s.ttft_s.p90,
                "tpot_p90_s": s.tpot_s.p90,
            }
        )
    return {
        "controller": mode,
        "slo_attainment": overall.slo_attainment,
        "requests": overall.requests,
        "failed": overall.failed,
        "phases": per_phase,
        "moves": moves,
        "attainment_over_time": attainment_over_time(
            records, slo.meets, args.window_s, args.tick_s
        ),
    }


MOVE_COLOURS = ("tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive")
"""The dotted lines of the controller's moves, one colour each (then round again)."""


def move_label(move: dict[str, Any]) -> str:
    """``d7 decode -> prefill, decided at 15 s, done at 18 s`` (one time when both round
    to the same second)."""
    name = f"{move['worker_id']} {move['from_role']} -> {move['to_role']}"
    done, decided = round(move["done_s"]), move.get("decided_s")
    if decided is None or round(decided) == done:
        return f"{name} at {done} s"
    return f"{name}, decided at {round(decided)} s, done at {done} s"


def plot(rows: Sequence[dict[str, Any]], phases: Sequence[Phase], path: Path, title: str) -> Path:
    """SLO attainment over time of each run (``shift_row`` rows), a dashed line at each
    phase's start with its label in a band above the data, and a dotted line per move
    of the controller, named in the legend (beside the axes: no label crosses a curve)."""
    from kvserve.loadgen.plots import pyplot, save

    fig, ax = pyplot().subplots(figsize=(10, 4.5))
    for row in rows:
        points = [(t, a) for t, a in row["attainment_over_time"] if a is not None]
        ax.plot(
            [t for t, _ in points],
            [a for _, a in points],
            marker=".",
            label=f"controller {row['controller']}",
        )
    moves = [m for row in rows for m in row["moves"] if m.get("done_s") is not None]
    for k, move in enumerate(moves):
        ax.axvline(
            move["done_s"],
            color=MOVE_COLOURS[k % len(MOVE_COLOURS)],
            linestyle=":",
            linewidth=1.8,
            label=move_label(move),
        )
    for start, phase in zip(phase_starts(phases), phases, strict=True):
        ax.axvline(start, color="grey", linestyle="--", alpha=0.5)
        ax.annotate(f"phase {phase.label}", (start, 1.09), xytext=(4, 0),
                    textcoords="offset points", fontsize=8, va="center")  # fmt: skip
    ax.set_ylim(0, 1.18)
    ax.set_yticks([0.0, 0.2, 0.4, 0.6, 0.8, 1.0])
    ax.set_xlabel("time since the load started (s)")
    ax.set_ylabel("SLO attainment (sliding window)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    return save(fig, path)


def conditions_of(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "phases": args.phases,
        "spread": args.spread,
        "seed": args.seed,
        "workers": args.workers,
        "controller": vars(ratio_config(args)),
        "controller_interval_s": args.controller_interval_s,
        "window_s": args.window_s,
    }


def headline(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    by_mode = {row["controller"]: row["slo_attainment"] for row in rows}
    on, off = by_mode.get("on"), by_mode.get("off")
    return {
        "metric": "SLO attainment over the whole shift, controller on vs off",
        "value": on,
        "baseline": off,
        "ratio": on / off if on is not None and off else None,
        "target": None,
    }


Serve = Callable[[str], tuple[list[RequestRecord], list[dict[str, Any]]]]
"""``mode -> (records, moves)``: the shift's requests served with the controller ``off`` or
``on``, and the controller's moves (:func:`shift_row`'s)."""


def run_scenario(
    args: argparse.Namespace,
    bench: str,
    serve: Serve,
    plot_as: tuple[str, str],
    conditions: Callable[[], dict[str, Any]],
) -> int:
    """Each of ``--modes`` through ``serve``, a row each; with ``--out`` the plot (file name
    and title: ``plot_as``); the JSON of ``bench`` with ``conditions()`` added to the
    scenario's (asked after the runs); 0."""
    rows = []
    for mode in args.modes:
        records, moves = serve(mode)
        rows.append(shift_row(args, mode, records, moves))
        attained = rows[-1]["slo_attainment"]
        log(f"{command(bench)}: controller {mode}: attainment {attained}, {len(moves)} moves")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        name, title = plot_as
        plot(rows, phases_of(args), args.out / name, title)
    emit(bench, {**conditions_of(args), **conditions()}, rows, headline(rows))
    return 0

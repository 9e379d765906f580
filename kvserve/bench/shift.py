"""``kvserve bench shift``: the P:D ratio controller, live, on a load that changes shape.

1. The shift workload (:mod:`kvserve.loadgen.shift`: e.g. prefill-heavy, then
   decode-heavy) is built from ``--phases``;
2. for ``--controller off`` then ``on`` (both by default), the deployment ``--workers`` is
   started on this machine (:class:`kvserve.cluster.launch.Cluster`) with the router's ratio
   controller disabled or enabled with the ``--controller-*`` settings (the router's own
   flags, :class:`router.config.RouterConfig`), the workload is sent, and the router's
   ``GET /v1/controller`` is polled every second for its moves;
3. each run gives a row: attainment overall and per phase, attainment over time (requests
   that arrived in a sliding window), the moves (decided and completed, in seconds from the
   load's start); ``--out`` gets the plot of both runs over time.

The flags, rows and plot are shared with ``kvserve sim shift`` (the same workload on the
simulator, at any scale).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar

import aiohttp

from kvserve.bench.settings import BENCH_ENV
from kvserve.loadgen.metrics import RequestRecord, summarize
from kvserve.loadgen.shift import Phase, attainment_over_time, parse_phase, phase_starts
from kvserve.loadgen.slo import AbsoluteSlo, SloTargets
from kvserve.report import emit, log
from kvserve.settings import add_config_args, config_from_args, flag_name, setting
from router.config import CONTROLLER_PREFIX, RouterConfig
from router.ratio import RatioConfig

DEFAULT_PHASES = ["512:16@0.25x150", "64:128@0.2x150"]
MODES = ("off", "on")
CONTROLLER_NAMES = (
    "controller_interval_s",
    *(CONTROLLER_PREFIX + f.name for f in fields(RatioConfig)),
)
"""The router's ``controller_*`` settings: flags here, passed on to the live router."""
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
    spread: float = 0.25
    seed: int = 0
    vocab: int = 49152
    modes: list[str] = setting(list(MODES), choices=MODES)
    window_s: float = 30.0
    tick_s: float = 5.0
    out: Path | None = None


@dataclass(frozen=True)
class ShiftLiveConfig:
    """The live cluster of ``bench shift``.

    - ``workers``: starting split, e.g. 1p1d;
    - ``timeout_s``: per-request timeout.
    """

    env_prefix: ClassVar[str] = BENCH_ENV
    workers: str = "1p1d"
    timeout_s: float = 600.0


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


def plot(rows: Sequence[dict[str, Any]], phases: Sequence[Phase], path: Path, title: str) -> Path:
    from kvserve.loadgen.plots import pyplot, save

    fig, ax = pyplot().subplots(figsize=(8, 4))
    for row in rows:
        points = [(t, a) for t, a in row["attainment_over_time"] if a is not None]
        ax.plot(
            [t for t, _ in points],
            [a for _, a in points],
            marker=".",
            label=f"controller {row['controller']}",
        )
        for move in row["moves"]:
            if move.get("done_s") is not None:
                ax.axvline(move["done_s"], color="tab:green", linestyle=":", alpha=0.8)
                ax.annotate(
                    f"{move['worker_id']}: {move['from_role']}->{move['to_role']}",
                    (move["done_s"], 0.05),
                    fontsize=7,
                    rotation=90,
                )
    for start, phase in zip(phase_starts(phases), phases, strict=True):
        ax.axvline(start, color="grey", linestyle="--", alpha=0.5)
        ax.annotate(phase.label, (start, 1.02), fontsize=7)
    ax.set_ylim(0, 1.1)
    ax.set_xlabel("time since the load started (s)")
    ax.set_ylabel("SLO attainment (sliding window)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
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


# -- the live run ------------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    """The shift's flags, the live cluster's, its pool and its workers' engine."""
    from kvserve.bench.settings import SegmentConfig
    from workers.config import EngineConfig

    add_shift_arguments(p)
    add_config_args(p, ShiftLiveConfig)
    add_config_args(p, SegmentConfig)
    add_config_args(p, EngineConfig)


def router_args(args: argparse.Namespace, mode: str) -> tuple[str, ...]:
    flags = ["--controller" if mode == "on" else "--no-controller"]
    for name in CONTROLLER_NAMES:
        flags += [flag_name(name), str(getattr(args, name))]
    return tuple(flags)


async def watch_moves(url: str, t0: float, moves: dict[int, dict[str, Any]]) -> None:
    """Poll ``GET /v1/controller`` every second; note when each move is first seen decided
    and completed, in seconds since ``t0`` (this process's clock)."""
    async with aiohttp.ClientSession() as session:
        while True:
            with contextlib.suppress(aiohttp.ClientError, ValueError):
                async with session.get(url + "/v1/controller") as response:
                    body = await response.json()
                now = time.perf_counter() - t0
                for i, entry in enumerate(body.get("history", [])):
                    move = moves.setdefault(i, {**entry, "decided_s": now, "done_s": None})
                    move.update({k: v for k, v in entry.items() if k not in move})
                    if entry.get("completed_at") is not None and move["done_s"] is None:
                        move["done_s"], move["result"] = now, entry["result"]
            await asyncio.sleep(1.0)


async def live_run(args: argparse.Namespace, url: str, mode: str) -> dict[str, Any]:
    from kvserve.loadgen.client import ClientOptions, fetch_models, run_load
    from kvserve.loadgen.shift import shift_requests

    model = (await fetch_models(url))[0]
    specs = shift_requests(phases_of(args), args.seed, args.vocab)
    moves: dict[int, dict[str, Any]] = {}
    watcher = asyncio.create_task(watch_moves(url, time.perf_counter(), moves))
    try:
        records = await run_load(
            url,
            model,
            specs,
            options=ClientOptions(args.timeout_s),
            progress=False,
            desc=f"controller {mode}",
        )
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    return shift_row(args, mode, records, [moves[i] for i in sorted(moves)])


def run(args: argparse.Namespace) -> int:
    from kvserve.bench.compare import started
    from kvserve.settings import config_from_args
    from workers.config import EngineConfig

    engine = config_from_args(EngineConfig, args)
    rows = []
    for mode in args.modes:
        with started(
            args.workers, engine, args.segment_mib, router_args=router_args(args, mode)
        ) as cluster:
            log(f"bench shift: {args.workers} up, controller {mode}")
            rows.append(asyncio.run(live_run(args, cluster.router_url, mode)))
            log(f"bench shift: controller {mode}: attainment {rows[-1]['slo_attainment']}")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        plot(
            rows,
            phases_of(args),
            args.out / "shift_live.png",
            f"P:D controller, live ({args.workers} at start, CPU)",
        )
    emit("shift", {**conditions_of(args), "engine": dict(vars(engine))}, rows, headline(rows))
    return 0

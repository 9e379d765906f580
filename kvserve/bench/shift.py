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

The flags, rows and plot are :mod:`kvserve.loadgen.shift_scenario`'s, shared with ``kvserve
sim shift`` (the same workload on the simulator, at any scale).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import aiohttp

from kvserve.bench.common import started
from kvserve.cluster.deployment import SegmentConfig
from kvserve.loadgen.client import ClientOptions, fetch_models, run_load
from kvserve.loadgen.metrics import RequestRecord
from kvserve.loadgen.shift import shift_requests
from kvserve.loadgen.shift_scenario import add_shift_arguments, phases_of, run_scenario
from kvserve.report import log
from kvserve.settings import BENCH_ENV, add_config_args, config_from_args, flag_name
from router.config import CONTROLLER_PREFIX
from router.control.ratio import RatioConfig
from workers.config import EngineConfig


@dataclass(frozen=True)
class ShiftLiveConfig:
    """The live cluster of ``bench shift``.

    - ``workers``: starting split, e.g. 1p1d;
    - ``timeout_s``: per-request timeout.
    """

    env_prefix: ClassVar[str] = BENCH_ENV
    workers: str = "1p1d"
    timeout_s: float = 600.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The shift's flags, the live cluster's, its pool and its workers' engine."""
    add_shift_arguments(p)
    for settings in (ShiftLiveConfig, SegmentConfig, EngineConfig):
        add_config_args(p, settings)


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


async def live_run(
    args: argparse.Namespace, url: str, mode: str
) -> tuple[list[RequestRecord], list[dict[str, Any]]]:
    """The shift's requests sent to the router at ``url`` while its moves are watched."""
    model = (await fetch_models(url))[0]
    specs = shift_requests(phases_of(args), args.seed, args.vocab)
    moves: dict[int, dict[str, Any]] = {}
    watcher = asyncio.create_task(watch_moves(url, time.perf_counter(), moves))
    try:
        options, desc = ClientOptions(args.timeout_s), f"controller {mode}"
        records = await run_load(url, model, specs, options=options, progress=False, desc=desc)
    finally:
        watcher.cancel()  # awaited by asyncio.run before it returns
    return records, [moves[i] for i in sorted(moves)]


def run(args: argparse.Namespace) -> int:
    engine = config_from_args(EngineConfig, args)
    names = ["controller_interval_s", *(CONTROLLER_PREFIX + f.name for f in fields(RatioConfig))]

    def serve(mode: str) -> tuple[list[RequestRecord], list[dict[str, Any]]]:
        """A fresh cluster, its router given the ``controller_*`` settings as flags."""
        flags = ["--controller" if mode == "on" else "--no-controller"]
        flags += [word for name in names for word in (flag_name(name), str(getattr(args, name)))]
        with started(args.workers, engine, args.segment_mib, router_args=tuple(flags)) as cluster:
            log(f"bench shift: {args.workers} up, controller {mode}")
            return asyncio.run(live_run(args, cluster.router_url, mode))

    plot_as = ("shift_live.png", f"P:D controller, live ({args.workers} at start, CPU)")
    return run_scenario(args, "shift", serve, plot_as, lambda: {"engine": dict(vars(engine))})

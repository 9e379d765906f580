"""``kvserve sim serve``: ``kvserve bench serve``'s workload, run on a simulated cluster.

The same flags build the same requests (workload, seed, salting per rate, arrivals), the
simulated deployment (:mod:`kvserve.sim.deploy`) serves them, and the same code turns the
records into the same JSON rows (:func:`kvserve.loadgen.sweep.rate_row`), so a simulated and
a measured run compare line by line. One cluster serves the warm-up and then every rate in
turn, as a real server does. SLOs must be absolute (a relative SLO is calibrated on a
server).
"""

from __future__ import annotations

import argparse
from typing import Any

from kvserve.loadgen import options as opt
from kvserve.loadgen.metrics import RequestRecord
from kvserve.loadgen.sweep import WARMUP_SALT, load_conditions, rate_row, report, run_sweep, timed
from kvserve.loadgen.workloads import salted, with_arrivals
from kvserve.sim import deploy
from kvserve.sim.cluster import SimCluster


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``bench serve``'s load settings and the simulated deployment's."""
    opt.add_load_settings(parser)
    deploy.add_arguments(parser)


def require_fixed_requests(args: argparse.Namespace, tool: str) -> None:
    """ValueError for the conversation workload, whose turns depend on the server's answers:
    ``tool`` replays fixed requests only."""
    if args.workload == opt.CONVERSATION:
        raise ValueError(f"{tool} replays fixed requests; conversations need a real server")


def simulate(
    args: argparse.Namespace, cluster: SimCluster, conditions: dict[str, Any]
) -> dict[str, Any]:
    """Run the sweep on ``cluster``: the result :func:`kvserve.bench.serve.serve_bench`
    returns for a real server (conditions, rows, sweep, runs, points)."""
    if args.slo_relative is not None:
        raise ValueError("kvserve sim serve needs absolute SLOs (--slo-ttft-s, --slo-tpot-s)")
    require_fixed_requests(args, "kvserve sim serve")
    workload = opt.build_workload(args)
    slo = opt.absolute_slo(args)
    warmup = salted(workload.specs[: args.warmup], WARMUP_SALT, args.vocab)
    if warmup:
        cluster.run(with_arrivals(warmup, [0.0] * len(warmup)))

    def one_rate(i: int, rate: float | None) -> tuple[dict[str, Any], list[RequestRecord]]:
        records = cluster.run(timed(args, salted(workload.specs, i, args.vocab), rate))
        return rate_row(args, rate, records, slo, None, label="sim serve"), records

    conditions = {**load_conditions(args, workload, slo), "deployment": conditions}
    return run_sweep(args, one_rate, slo, conditions)


def run(args: argparse.Namespace) -> int:
    cluster, conditions = deploy.build(args)
    return report("sim serve", args, simulate(args, cluster, conditions))

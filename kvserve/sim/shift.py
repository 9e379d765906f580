"""``kvserve sim shift``: ``kvserve bench shift``'s changing load on the simulator.

The same flags build the same requests and the same controller settings; the simulated
deployment (:mod:`kvserve.sim.deploy`, any scale and cost) serves them with the ratio
controller off and on (:class:`router.control.ratio.RatioController`, the router's own), and the
rows and plot are :mod:`kvserve.loadgen.shift_scenario`'s, as ``bench shift``'s are.
"""

from __future__ import annotations

import argparse
from typing import Any

from kvserve.loadgen import shift_scenario as scenario
from kvserve.loadgen.metrics import RequestRecord
from kvserve.loadgen.shift import shift_requests
from kvserve.sim import deploy
from kvserve.sim.request import RoleEvent
from router.control.ratio import RatioController


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``bench shift``'s workload and controller settings and the simulated deployment's."""
    scenario.add_shift_arguments(parser)
    deploy.add_arguments(parser)
    parser.set_defaults(concurrency=0)  # not a setting here: the phases set the load


def move_of(event: RoleEvent) -> dict[str, Any]:
    c = event.change
    return {
        "worker_id": c.worker_id,
        "from_role": c.from_role,
        "to_role": c.to_role,
        "reason": c.reason,
        "decided_s": c.at_s,
        "done_s": event.done_s,
    }


def run(args: argparse.Namespace) -> int:
    specs = shift_requests(scenario.phases_of(args), args.seed, args.vocab)
    deployment: dict[str, Any] = {}

    def serve(mode: str) -> tuple[list[RequestRecord], list[dict[str, Any]]]:
        controller = RatioController(scenario.ratio_config(args)) if mode == "on" else None
        cluster, conditions = deploy.build(args, controller)
        deployment.update(conditions)
        records = cluster.run(specs)
        return records, [move_of(e) for e in cluster.role_events]

    title = f"P:D controller, simulated ({args.workers} at start, {args.cost})"
    plot_as = ("shift_sim.png", title)
    return scenario.run_scenario(
        args, "sim shift", serve, plot_as, lambda: {"deployment": deployment}
    )

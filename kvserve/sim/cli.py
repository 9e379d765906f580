"""The ``kvserve sim <what>`` verbs. Each entry names a module that has
``add_arguments(parser)`` and ``run(args) -> int`` (imported only when chosen or listed)."""

from __future__ import annotations

import argparse
import importlib
from typing import Any

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    # name: (module, help)
    "serve": (
        "kvserve.sim.serve",
        "bench serve's workload on a simulated cluster: the same metrics and JSON",
    ),
    "shift": (
        "kvserve.sim.shift",
        "bench shift's changing load, simulated: the ratio controller off and on (JSON, PNG)",
    ),
    "validate": (
        "kvserve.sim.validate",
        "run a deployment for real and simulated: error of p50/p90 TTFT and TPOT",
    ),
    "calibrate": (
        "kvserve.sim.calibrate",
        "fit a step-cost model to our own engine's measured step times (writes a cost file)",
    ),
    "crossover": (
        "kvserve.sim.crossover",
        "link bandwidth below which disaggregation costs TTFT, vs prompt length (JSON, PNG)",
    ),
    "hidden": (
        "kvserve.sim.hidden",
        "share of the KV transfer hidden by layer-wise streaming, vs layers and link (JSON, PNG)",
    ),
    "ratio": (
        "kvserve.sim.ratio",
        "goodput of every P:D split of N instances, prompt- to answer-heavy mixes (JSON, PNG)",
    ),
}


def _run(module: str) -> Any:
    def run(args: argparse.Namespace) -> int:
        return int(importlib.import_module(module).run(args))

    return run


def add_parsers(sim: argparse.ArgumentParser) -> None:
    """Add one sub-verb per :data:`SUBCOMMANDS` entry to the ``sim`` parser."""
    verbs = sim.add_subparsers(dest="what", required=True)
    for name, (module, text) in SUBCOMMANDS.items():
        p = verbs.add_parser(name, help=text, description=text)
        importlib.import_module(module).add_arguments(p)
        p.set_defaults(func=_run(module))

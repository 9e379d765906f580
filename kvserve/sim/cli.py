"""The ``kvserve sim <what>`` verbs, a table (:data:`SIM`): each names a module that has
``add_arguments(parser)`` and ``run(args) -> int`` (imported only when chosen or listed)."""

from __future__ import annotations

import argparse

from kvserve.verbs import Verb, add_verbs

SIM = (
    Verb(
        "serve",
        "bench serve's workload on a simulated cluster: the same metrics and JSON",
        "kvserve.sim.serve",
    ),
    Verb(
        "shift",
        "bench shift's changing load, simulated: the ratio controller off and on (JSON, PNG)",
        "kvserve.sim.shift",
    ),
    Verb(
        "validate",
        "run a deployment for real and simulated: error of p50/p90 TTFT and TPOT",
        "kvserve.sim.validate",
    ),
    Verb(
        "calibrate",
        "fit a step-cost model to our own engine's measured step times (writes a cost file)",
        "kvserve.sim.calibrate",
    ),
    Verb(
        "crossover",
        "link bandwidth below which disaggregation costs TTFT, vs prompt length (JSON, PNG)",
        "kvserve.sim.crossover",
    ),
    Verb(
        "hidden",
        "share of the KV transfer hidden by layer-wise streaming, vs layers and link (JSON, PNG)",
        "kvserve.sim.hidden",
    ),
    Verb(
        "ratio",
        "goodput of every P:D split of N instances, prompt- to answer-heavy mixes (JSON, PNG)",
        "kvserve.sim.ratio_settings",
        "kvserve.sim.ratio",
    ),
)
"""Every ``kvserve sim`` verb, in the order ``--help`` lists them."""


def add_arguments(sim: argparse.ArgumentParser) -> None:
    """Add one sub-verb per :data:`SIM` entry to the ``sim`` parser."""
    add_verbs(sim, SIM, "what")

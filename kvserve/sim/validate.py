"""``kvserve sim validate``: the simulator against a measurement of the same run.

1. The deployment ``--workers`` is started on this machine and ``kvserve bench serve``'s
   sweep runs against it (:func:`kvserve.bench.compare.run_deployment`: the same code as
   ``bench compare``);
2. the same flags (workload, seed, rates, arrivals, engine settings) run on the simulated
   twin of that deployment, with ``--cost`` (a file from ``kvserve sim calibrate``);
3. per rate, p50 and p90 of TTFT and TPOT, measured and simulated, and the relative error
   ``simulated / measured - 1``. The headline is the largest error's magnitude; the target
   is 10%.
"""

from __future__ import annotations

import argparse
from typing import Any

from kvserve.bench.compare import run_deployment
from kvserve.cluster.deployment import SegmentConfig
from kvserve.loadgen import options as opt
from kvserve.report import emit, log
from kvserve.settings import add_config_args, config_from_args
from kvserve.sim import deploy
from kvserve.sim.serve import require_fixed_requests, simulate
from workers.config import EngineConfig

TARGET = 0.10
METRICS = ("ttft_s", "tpot_s")
QUANTILES = ("p50", "p90")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``bench serve``'s load settings, the real workers' engine and pool, and the simulated
    deployment's settings (its engine settings are the real workers')."""
    opt.add_load_settings(parser)
    add_config_args(parser, EngineConfig)
    add_config_args(parser, SegmentConfig)
    deploy.add_arguments(parser, engine_flags=False)


def errors(measured: dict[str, Any], simulated: dict[str, Any]) -> list[dict[str, Any]]:
    """Per metric and quantile of two ``summary`` objects: both values and the error."""
    out = []
    for metric in METRICS:
        for q in QUANTILES:
            real, sim = measured[metric][q], simulated[metric][q]
            error = sim / real - 1.0 if real and sim is not None else None
            out.append(
                {
                    "metric": metric,
                    "quantile": q,
                    "measured": real,
                    "simulated": sim,
                    "error": error,
                }
            )
    return out


def run(args: argparse.Namespace) -> int:
    if args.cost.startswith("roofline:"):
        log("sim validate: a roofline cost is not calibrated on this machine; expect errors")
    require_fixed_requests(args, "kvserve sim validate")
    engine = config_from_args(EngineConfig, args)
    measured = run_deployment(args, args.workers, engine, args.policy)
    cluster, conditions = deploy.build(args)
    simulated = simulate(args, cluster, conditions)
    rows = []
    for real_row, sim_row in zip(measured["rows"], simulated["rows"], strict=True):
        rows.append(
            {
                "rate": real_row["rate"],
                "measured_attainment": real_row["summary"]["slo_attainment"],
                "simulated_attainment": sim_row["summary"]["slo_attainment"],
                "errors": errors(real_row["summary"], sim_row["summary"]),
            }
        )
    worst = [abs(e["error"]) for r in rows for e in r["errors"] if e["error"] is not None]
    conditions = {
        **simulated["conditions"],
        "engine": dict(vars(engine)),
        "placement": measured["placement"],
    }
    emit(
        "sim validate",
        conditions,
        rows,
        {
            "metric": "largest |simulated / measured - 1| of p50 and p90 TTFT and TPOT",
            "value": max(worst) if worst else None,
            "baseline": None,
            "ratio": None,
            "target": TARGET,
        },
    )
    return 0

"""``kvserve bench compare``: one workload, the same cores, deployments started by the tool.

1. For each deployment of ``--deployments`` (default ``1p1d 2m``: 1 prefill + 1 decode
   worker against 2 mixed workers with chunked prefill; any ``<n>p<m>d<k>m`` split) and each
   router policy of ``--policies`` (default ``cache_aware``), in that order (deployment
   first), a fresh cluster is started on this machine (:mod:`kvserve.cluster.launch`: free
   loopback ports, each worker pinned to its own cores where there are enough, the same
   engine settings for every worker);
2. the serving benchmark's sweep (:func:`kvserve.bench.serve.serve_bench`) runs against its
   router with the same seed, requests, arrival process, rates and absolute SLOs;
3. the cluster is stopped and the next one starts.

A result row per (deployment, policy), keyed by both. The headline is the ratio of
DistServe goodputs (the highest rate with at least 90% of requests meeting both SLOs,
interpolated) of the first run to the second (two deployments, or one deployment under two
policies), with every attainment curve in the results. Absolute SLOs are required so every
run is held to the same targets.

With ``--out DIR`` it also writes ``DIR/compare_runs.json`` (:func:`write_plots`): for each
run, its label, attainment by rate, goodput and the record of every request of every rate
(:class:`~kvserve.loadgen.metrics.RequestRecord`, as ``bench serve`` writes them). The plots
(:func:`draw`) are drawn from that content alone, so ``--replot DIR/compare_runs.json`` draws
them again, with today's plotting code, without starting a cluster:

- ``attainment_vs_rate.png``: SLO attainment against the rate, one line per run;
- ``goodput.png``: the DistServe goodput of each run;
- ``latency_cdf.png``: TTFT, TPOT and ITL CDFs, one line per run and rate (log time axis).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from kvserve.bench.common import ratio_headline, started
from kvserve.cluster.deployment import SegmentConfig
from kvserve.loadgen import options as opt
from kvserve.report import emit, log
from kvserve.settings import BENCH_ENV, config_from_args, setting
from router.config import POLICIES
from workers.config import EngineConfig

RUNS_FILE = "compare_runs.json"


@dataclass(frozen=True)
class CompareConfig:
    """The deployments ``kvserve bench compare`` starts.

    - ``deployments``: splits to start in turn (``<n>p<m>d<k>m``), the first against the
      second;
    - ``policies``: router policies, each run on every deployment (a fresh cluster each);
    - ``disagg_threshold_tokens``: the router's (default: the router's, 256);
    - ``replot``: run nothing, draw the plots again from this ``compare_runs.json`` (what
      ``--out`` saves) into ``--out`` (default: the file's folder).
    """

    env_prefix: ClassVar[str] = BENCH_ENV
    deployments: list[str] = setting(["1p1d", "2m"])
    policies: list[str] = setting(["cache_aware"], choices=POLICIES, aliases=("--policy",))
    disagg_threshold_tokens: int | None = None
    replot: Path | None = None


SETTINGS = (CompareConfig, SegmentConfig, *opt.LOAD_SETTINGS, EngineConfig)


def run_deployment(
    args: argparse.Namespace, name: str, engine: EngineConfig, policy: str
) -> dict[str, Any]:
    """Start deployment ``name`` with router policy ``policy``, run the sweep against it
    (``bench serve``'s flags against its router: text prompts are decoded by the tokenizer
    of ``--tokenizer``, else of the workers' model directory, the served name being no
    path), stop it; the serve result."""
    from kvserve.bench.serve import serve_bench

    options = {"policy": policy, "disagg_threshold_tokens": args.disagg_threshold_tokens}
    with started(name, engine, args.segment_mib, **options) as cluster:
        log(f"bench compare: {name} ({policy}) up ({'; '.join(cluster.plan.notes) or 'pinned'})")
        serve = copy.copy(args)
        serve.url, serve.model, serve.out = cluster.router_url, "", None
        serve.tokenizer = args.tokenizer or cluster.spec.model_dir
        serve.deployment = [*args.deployment, f"workers={name}", f"policy={policy}"]
        result = serve_bench(serve)
        result["placement"] = {
            "shared_cores": cluster.plan.shared_cores,
            "workers": {p.name: list(p.cores) for p in cluster.plan.workers},
        }
    return result


def goodput(result: dict[str, Any]) -> float | None:
    sweep = result["sweep"]
    return None if sweep is None else sweep.interpolated_rate


def attainment(result: dict[str, Any]) -> list[list[Any]]:
    """A run's (rate, attainment) points as JSON carries them."""
    return [[opt.json_rate(x), a] for x, a in result["points"]]


def saved_runs(results: dict[tuple[str, str], dict[str, Any]]) -> list[dict[str, Any]]:
    """The runs of ``results`` as ``compare_runs.json`` holds them (module docstring)."""
    return [
        {
            "label": f"{name} {policy}",
            "points": attainment(r),
            "goodput_rps": goodput(r),
            "rates": [
                {"label": label, "records": [dataclasses.asdict(x) for x in records]}
                for label, records in r["runs"]
            ],
        }
        for (name, policy), r in results.items()
    ]


def draw(out: Path, runs: list[dict[str, Any]]) -> list[Path]:
    """The three plots of ``runs`` (:func:`saved_runs`) into ``out``; the files written."""
    from kvserve.loadgen import plots
    from kvserve.loadgen.metrics import RequestRecord

    def records(rate: dict[str, Any]) -> list[RequestRecord]:
        return [
            RequestRecord(**{**r, "chunk_times_s": tuple(r["chunk_times_s"])})
            for r in rate["records"]
        ]

    out.mkdir(parents=True, exist_ok=True)
    series = [(run["label"], [(float(x), a) for x, a in run["points"]]) for run in runs]
    bars = [(run["label"], run["goodput_rps"]) for run in runs]
    cdfs = [
        (f"{run['label']} {rate['label']}", records(rate)) for run in runs for rate in run["rates"]
    ]
    return [
        plots.attainment_vs_rate(series, out / "attainment_vs_rate.png"),
        plots.goodput_bars(bars, out / "goodput.png", "goodput (req/s)"),
        plots.latency_cdfs(cdfs, out / "latency_cdf.png"),
    ]


def write_plots(out: Path, results: dict[tuple[str, str], dict[str, Any]]) -> list[Path]:
    """Save the runs of ``results`` to ``out/compare_runs.json`` and draw them into ``out``;
    the files written."""
    runs = saved_runs(results)
    out.mkdir(parents=True, exist_ok=True)
    (out / RUNS_FILE).write_text(json.dumps({"runs": runs}) + "\n")
    return [out / RUNS_FILE, *draw(out, runs)]


def run(args: argparse.Namespace) -> int:
    if args.replot is not None:
        runs = json.loads(args.replot.read_text())["runs"]
        files = draw(args.out or args.replot.parent, runs)
        log(f"bench compare: plots of {args.replot} drawn again: {', '.join(map(str, files))}")
        return 0
    if args.slo_ttft_s is None and args.slo_tpot_s is None and args.slo_tbt_s is None:
        raise ValueError("bench compare needs absolute SLOs: --slo-ttft-s and --slo-tpot-s")
    engine = config_from_args(EngineConfig, args)
    results = {
        (name, policy): run_deployment(args, name, engine, policy)
        for name in args.deployments
        for policy in args.policies
    }
    rows = [
        {
            "deployment": name,
            "policy": policy,
            "goodput_rps": goodput(r),
            "highest_passing_rate": r["sweep"].highest_passing_rate if r["sweep"] else None,
            "attainment_by_rate": attainment(r),
            "placement": r["placement"],
            "runs": r["rows"],
        }
        for (name, policy), r in results.items()
    ]
    labels = [f"{name} {policy}" for name, policy in results]
    goodputs = [goodput(r) for r in results.values()] + [None]
    if args.out is not None:
        write_plots(args.out, results)
    conditions = next(iter(results.values()))["conditions"]
    conditions = {
        **{k: v for k, v in conditions.items() if k not in ("url", "deployment")},
        "deployments": args.deployments,
        "policies": args.policies,
        "engine": dict(vars(engine)),
        "same_cores": "every deployment on this machine's cores, one after the other",
    }
    metric = (
        f"goodput {' / goodput '.join(labels[:2])} "
        "(DistServe: highest rate with >= 90% SLO attainment, interpolated)"
    )
    target = 1.5 if args.workload == "prefill-heavy" else None
    emit("compare", conditions, rows, ratio_headline(metric, goodputs[0], goodputs[1], target))
    return 0

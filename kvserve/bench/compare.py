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
policies), with every attainment curve in the results (and plotted side by side with
``--out``, which also saves what the plots are drawn from: :mod:`.compare_plot`; ``--replot``
draws them again). Absolute SLOs are required so every run is held to the same targets.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from kvpool.config import PoolConfig
from kvserve.cluster.deployment import SegmentConfig, parse_deployment
from kvserve.loadgen import options as opt
from kvserve.report import emit, log
from kvserve.settings import BENCH_ENV, config_from_args, setting
from router.config import POLICIES
from workers.config import EngineConfig

if TYPE_CHECKING:
    from kvserve.cluster.launch import Cluster


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


def _serve_args(
    cluster: Cluster, args: argparse.Namespace, name: str, policy: str
) -> argparse.Namespace:
    """``bench serve``'s flags against ``cluster``: text prompts are decoded by the tokenizer
    of ``--tokenizer``, else of the workers' model directory (the served name is no path)."""
    serve = copy.copy(args)
    serve.url, serve.model, serve.out = cluster.router_url, "", None
    serve.tokenizer = args.tokenizer or cluster.spec.model_dir
    serve.deployment = [*args.deployment, f"workers={name}", f"policy={policy}"]
    return serve


@contextlib.contextmanager
def started(name: str, engine: EngineConfig, segment_mib: int, **options: Any) -> Iterator[Cluster]:
    """Deployment ``name`` (e.g. ``1p1d``) running on this machine, on free loopback ports,
    its logs in a temporary folder; stopped on exit. ``options``: further
    :class:`~kvserve.cluster.spec.ClusterSpec` fields (router policy, router flags)."""
    from kvserve.cluster.launch import Cluster, ClusterSpec

    prefill, decode, mixed = parse_deployment(name)
    with tempfile.TemporaryDirectory() as tmp:
        spec = ClusterSpec(
            prefill=prefill,
            decode=decode,
            mixed=mixed,
            engine=engine,
            pool=PoolConfig(pool_segment_mib=segment_mib),
            log_dir=Path(tmp),
            **options,
        ).with_free_ports()
        with Cluster(spec).start() as cluster:
            yield cluster


def run_deployment(
    args: argparse.Namespace, name: str, engine: EngineConfig, policy: str
) -> dict[str, Any]:
    """Start deployment ``name`` with router policy ``policy``, run the sweep against it,
    stop it; the serve result."""
    from kvserve.bench.serve import serve_bench

    options = {"policy": policy, "disagg_threshold_tokens": args.disagg_threshold_tokens}
    with started(name, engine, args.segment_mib, **options) as cluster:
        log(f"bench compare: {name} ({policy}) up ({'; '.join(cluster.plan.notes) or 'pinned'})")
        result = serve_bench(_serve_args(cluster, args, name, policy))
        result["placement"] = {
            "shared_cores": cluster.plan.shared_cores,
            "workers": {p.name: list(p.cores) for p in cluster.plan.workers},
        }
    return result


def goodput(result: dict[str, Any]) -> float | None:
    sweep = result["sweep"]
    return None if sweep is None else sweep.interpolated_rate


def run(args: argparse.Namespace) -> int:
    if args.replot is not None:
        from kvserve.bench.compare_plot import replot

        files = replot(args.replot, args.out or args.replot.parent)
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
            "attainment_by_rate": [[opt.json_rate(x), a] for x, a in r["points"]],
            "placement": r["placement"],
            "runs": r["rows"],
        }
        for (name, policy), r in results.items()
    ]
    labels = [f"{name} {policy}" for name, policy in results]
    goodputs = [goodput(r) for r in results.values()]
    first = goodputs[0]
    second = goodputs[1] if len(goodputs) > 1 else None
    ratio = first / second if first is not None and second else None
    if args.out is not None:
        from kvserve.bench.compare_plot import write_plots

        write_plots(args.out, results)
    conditions = next(iter(results.values()))["conditions"]
    conditions = {
        **{k: v for k, v in conditions.items() if k not in ("url", "deployment")},
        "deployments": args.deployments,
        "policies": args.policies,
        "engine": dict(vars(engine)),
        "same_cores": "every deployment on this machine's cores, one after the other",
    }
    emit(
        "compare",
        conditions,
        rows,
        {
            "metric": f"goodput {' / goodput '.join(labels[:2])} "
            "(DistServe: highest rate with >= 90% SLO attainment, interpolated)",
            "value": first,
            "baseline": second,
            "ratio": ratio,
            "target": 1.5 if args.workload == "prefill-heavy" else None,
        },
    )
    return 0

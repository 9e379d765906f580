"""The ``kvserve bench <what>`` verbs: each one's arguments and the function that runs it
(its module is imported only when it runs, or, for its arguments, when ``bench`` is the verb
being parsed: :func:`kvserve.cli.build_parser`)."""

from __future__ import annotations

import argparse

from kvserve.settings import add_config_args, add_verb, config_from_args
from workers.config import EngineConfig


def _bench_overlap(args: argparse.Namespace) -> int:
    from kvserve.bench.overlap import run_bench

    run_bench(args, config_from_args(EngineConfig, args))
    return 0


def _bench_prefix(args: argparse.Namespace) -> int:
    from kvserve.bench.prefix import run_bench

    run_bench(args, config_from_args(EngineConfig, args))
    return 0


def _bench_serve(args: argparse.Namespace) -> int:
    from kvserve.bench.serve import run

    return run(args)


def _bench_compare(args: argparse.Namespace) -> int:
    from kvserve.bench.compare import run

    return run(args)


def _bench_peer(args: argparse.Namespace) -> int:
    from kvserve.bench.peer import run

    return run(args)


def _bench_trace(args: argparse.Namespace) -> int:
    from kvserve.bench.trace import run

    return run(args)


def _bench_shift(args: argparse.Namespace) -> int:
    from kvserve.bench.shift import run

    return run(args)


def _bench_pressure(args: argparse.Namespace) -> int:
    from kvserve.bench.pressure import run

    return run(args)


def _bench_hashing(args: argparse.Namespace) -> int:
    from kvserve.bench.hashing import run

    return run(args)


def _bench_pool(args: argparse.Namespace) -> int:
    from kvserve.bench.pool import run_bench

    run_bench(args)
    return 0


def _bench_engine(args: argparse.Namespace) -> int:
    from kvserve.bench.engine import run_bench

    run_bench(args, config_from_args(EngineConfig, args))
    return 0


def _bench_profile(args: argparse.Namespace) -> int:
    from kvserve.bench.profile import run_profile

    run_profile(args, config_from_args(EngineConfig, args))
    return 0


def add_parsers(bench: argparse.ArgumentParser) -> None:
    """Add one sub-verb per benchmark to the ``bench`` parser."""
    bench_verbs = bench.add_subparsers(dest="what", required=True)
    b = add_verb(bench_verbs, "engine", _bench_engine, "engine throughput against transformers")
    b.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 16, 32])
    b.add_argument("--prompt-len", type=int, default=128)
    b.add_argument("--output-len", type=int, default=64)
    b.add_argument("--repeat", type=int, default=3)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument(
        "--serve-factor",
        type=int,
        default=4,
        help="serving workload: this many requests per unit of concurrency",
    )
    add_config_args(b, EngineConfig)
    pr = add_verb(bench_verbs, "profile", _bench_profile, "where a decode step's time goes")
    pr.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    pr.add_argument("--prompt-len", type=int, default=512)
    pr.add_argument("--steps", type=int, default=20, help="decode steps timed and profiled")
    pr.add_argument("--seed", type=int, default=0)
    add_config_args(pr, EngineConfig)

    bo = add_verb(
        bench_verbs,
        "overlap",
        _bench_overlap,
        "share of KV transfer hidden by layer-wise streaming (vs transfer after prefill)",
    )
    bo.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    bo.add_argument("--repeat", type=int, default=3)
    bo.add_argument("--seed", type=int, default=0)
    bo.add_argument("--segment-mib", type=int, default=1024, help="pool memory per engine")
    add_config_args(bo, EngineConfig)

    bx = add_verb(
        bench_verbs,
        "prefix",
        _bench_prefix,
        "TTFT of a prompt whose prefix is in the pool, on another prefill worker, vs cold",
    )
    bx.add_argument("--prefix", type=int, default=2048, help="shared prefix tokens")
    bx.add_argument("--tail", type=int, default=32, help="tokens after the prefix")
    bx.add_argument("--repeat", type=int, default=4)
    bx.add_argument("--seed", type=int, default=0)
    bx.add_argument("--segment-mib", type=int, default=512, help="pool memory per worker")
    add_config_args(bx, EngineConfig)

    from kvserve.bench.compare import add_arguments as add_compare_arguments
    from kvserve.bench.peer import add_arguments as add_peer_arguments
    from kvserve.bench.trace import add_arguments as add_trace_arguments
    from kvserve.loadgen.options import add_arguments as add_serve_arguments

    add_serve_arguments(
        add_verb(
            bench_verbs,
            "serve",
            _bench_serve,
            "serving load (any OpenAI-compatible server): latency, SLO attainment, goodput",
        )
    )
    add_compare_arguments(
        add_verb(
            bench_verbs,
            "compare",
            _bench_compare,
            "one workload on deployments it starts itself (1p1d vs 2m): goodput ratio",
        )
    )
    add_peer_arguments(
        add_verb(
            bench_verbs,
            "peer",
            _bench_peer,
            "kvserve side by side with vLLM's CPU build (installed on first use), same cores",
        )
    )
    add_trace_arguments(
        add_verb(
            bench_verbs,
            "trace",
            _bench_trace,
            "prefix hit rate of a Mooncake trace: real pool vs LRU, local caches vs shared",
        )
    )

    from kvserve.bench.shift import add_arguments as add_shift_arguments

    add_shift_arguments(
        add_verb(
            bench_verbs,
            "shift",
            _bench_shift,
            "the P:D ratio controller live: a load that turns from prefill- to decode-heavy",
        )
    )

    from kvserve.bench.pressure import add_arguments as add_pressure_arguments

    add_pressure_arguments(
        add_verb(
            bench_verbs,
            "pressure",
            _bench_pressure,
            "hand-offs through a pool too small for the load: first-to-second-token gap, "
            "landing stall detection against the old fixed wait",
        )
    )

    from kvserve.bench.hashing import add_arguments as add_hashing_arguments

    add_hashing_arguments(
        add_verb(
            bench_verbs,
            "hashing",
            _bench_hashing,
            "cost of the keyed prefix chain and the block digests per 1,000 tokens vs prefill",
        )
    )

    bp = add_verb(bench_verbs, "pool", _bench_pool, "KV pool put/get GB/s against memcpy")
    bp.add_argument("--sizes-kib", type=int, nargs="+", default=[16, 64, 256, 1024, 4096])
    bp.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16, 64, 256])
    bp.add_argument(
        "--max-batch-mib",
        type=int,
        default=256,
        help="skip size x batch combinations above this many MiB",
    )
    bp.add_argument("--repeat", type=int, default=3)
    bp.add_argument("--seed", type=int, default=0)

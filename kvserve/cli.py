"""``kvserve <verb>``: the one command line of the project.

Verbs: ``up`` (a whole cluster on this machine), ``worker`` and ``router`` (one process of
a cluster), ``generate`` (text from the engine), ``pool`` (run the KV pool's mooncake_master),
``prepare-model`` (convert the shipped default model, offline), ``make-model`` (a tiny
random-weight model for tests), ``bench engine``, ``bench pool``.
Engine settings are flags with ``KVSERVE_*`` environment variables (:mod:`kvserve.settings`).
Heavy modules are imported inside each verb so ``kvserve --help`` stays fast.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from kvpool.config import PoolConfig
from kvpool.master import MasterConfig
from kvserve.settings import add_config_args, config_from_args
from proto.registry import ClusterConfig
from workers.config import EngineConfig, WorkerConfig


def _generate(args: argparse.Namespace) -> int:
    from workers.engine import Engine
    from workers.sequence import SamplingParams

    engine = Engine(config_from_args(EngineConfig, args))
    tok = engine.tokenizer
    prompts = args.prompt or [sys.stdin.read()]
    ids = [
        tok.apply_chat_template([{"role": "user", "content": p}]) if args.chat else tok.encode(p)
        for p in prompts
    ]
    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        stop=tuple(args.stop),
    )
    for prompt, out in zip(prompts, engine.generate(ids, params), strict=True):
        if len(prompts) > 1:
            print(f"### {prompt}")
        print(out.text)
    s = engine.stats
    print(
        f"[{len(prompts)} request(s), {s.output_tokens} tokens in {s.busy_seconds:.2f}s, "
        f"{s.steps} steps]",
        file=sys.stderr,
    )
    return 0


def _prepare_model(args: argparse.Namespace) -> int:
    from workers.model.prepare import prepare_default_model

    print(prepare_default_model(Path(args.out) if args.out else None, force=args.force))
    return 0


def _make_model(args: argparse.Namespace) -> int:
    from workers.model.prepare import make_tiny_model

    path = make_tiny_model(
        Path(args.out),
        seed=args.seed,
        arch=args.arch,
        layers=args.layers,
        hidden=args.hidden,
        heads=args.heads,
        kv_heads=args.kv_heads,
        tokenizer_dir=Path(args.tokenizer_from) if args.tokenizer_from else None,
    )
    print(path)
    return 0


def _pool(args: argparse.Namespace) -> int:
    import signal

    from kvpool.master import MasterProcess

    cfg = config_from_args(MasterConfig, args)
    master = MasterProcess(cfg).start()
    stopped: list[bool] = []

    def stop(*_: object) -> None:
        stopped.append(True)
        master.terminate()

    signal.signal(signal.SIGTERM, stop)
    print(
        f"kvserve pool: mooncake_master up: rpc {cfg.rpc_address}, metrics {cfg.metrics_url}; "
        f"mooncake_http_metadata_server up: {cfg.metadata_url} (Ctrl-C stops both)",
        file=sys.stderr,
        flush=True,
    )
    try:
        code = master.wait()
        return 0 if stopped else code
    except KeyboardInterrupt:
        return 0
    finally:
        master.stop()


def _logging() -> None:
    import logging

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


def _worker(args: argparse.Namespace) -> int:
    from workers.server import serve

    _logging()
    return serve(
        config_from_args(WorkerConfig, args),
        config_from_args(EngineConfig, args),
        config_from_args(PoolConfig, args),
        config_from_args(ClusterConfig, args),
    )


def _router(args: argparse.Namespace) -> int:
    from router.main import serve

    _logging()
    from router.config import RouterConfig

    serve(
        config_from_args(RouterConfig, args),
        config_from_args(ClusterConfig, args),
        config_from_args(PoolConfig, args),
    )
    return 0


def _up(args: argparse.Namespace) -> int:
    from kvserve.up import run

    return run(args)


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


def _chaos(args: argparse.Namespace) -> int:
    from kvserve.chaos import run

    return run(args)


def _probe(args: argparse.Namespace) -> int:
    from kvserve.probe import run

    return run(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvserve", description=__doc__.splitlines()[0])
    verbs = parser.add_subparsers(dest="verb", required=True)

    def verb(
        name: str,
        fn: Callable[[argparse.Namespace], int],
        text: str,
        sub: argparse._SubParsersAction[argparse.ArgumentParser] | None = None,
    ) -> argparse.ArgumentParser:
        p = (sub or verbs).add_parser(name, help=text, description=text)
        p.set_defaults(func=fn)
        return p

    from kvserve.up import add_arguments as add_up_arguments
    from router.config import RouterConfig

    add_up_arguments(
        verb("up", _up, "run a whole cluster on this machine: pool, Redis, workers, router")
    )
    w = verb("worker", _worker, "serve one engine over gRPC (role prefill, decode or mixed)")
    for worker_cls in (WorkerConfig, EngineConfig, PoolConfig, ClusterConfig):
        add_config_args(w, worker_cls)
    r = verb("router", _router, "the OpenAI-compatible HTTP API and the conductor")
    for router_cls in (RouterConfig, ClusterConfig, PoolConfig):
        add_config_args(r, router_cls)

    g = verb("generate", _generate, "generate text from the model through the engine")
    g.add_argument("prompt", nargs="*", help="prompts (read from stdin if none)")
    g.add_argument(
        "--chat",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="wrap each prompt in the model's chat template",
    )
    g.add_argument("--max-tokens", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--stop", action="append", default=[])
    add_config_args(g, EngineConfig)

    p = verb(
        "prepare-model",
        _prepare_model,
        "convert the shipped SmolLM2-135M-Instruct GGUF into a HF directory (offline)",
    )
    p.add_argument("--out", default="", help="target directory (default: the model cache)")
    p.add_argument("--force", action="store_true", help="convert again even if present")

    m = verb("make-model", _make_model, "write a deterministic tiny random-weight model")
    m.add_argument("--out", required=True)
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--arch", choices=["llama", "qwen2", "qwen3"], default="llama")
    m.add_argument("--layers", type=int, default=4)
    m.add_argument("--hidden", type=int, default=128)
    m.add_argument("--heads", type=int, default=4)
    m.add_argument("--kv-heads", type=int, default=2)
    m.add_argument(
        "--tokenizer-from",
        default="",
        help="model directory to copy the tokenizer from (default: SmolLM2)",
    )

    pool = verb("pool", _pool, "run a mooncake_master (the KV pool) for this machine")
    from kvserve.chaos import add_arguments as add_chaos_arguments

    add_chaos_arguments(
        verb("chaos", _chaos, "load on a loopback cluster while killing and restarting its parts")
    )

    add_config_args(pool, MasterConfig)
    from kvserve.probe import add_arguments as add_probe_arguments

    add_probe_arguments(
        verb("probe", _probe, "health check of a worker, router or pool service (0: healthy)")
    )

    bench = verbs.add_parser("bench", help="benchmarks (one JSON object on stdout)")
    bench_verbs = bench.add_subparsers(dest="what", required=True)
    b = verb("engine", _bench_engine, "engine throughput against transformers", bench_verbs)
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
    pr = verb("profile", _bench_profile, "where a decode step's time goes", bench_verbs)
    pr.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    pr.add_argument("--prompt-len", type=int, default=512)
    pr.add_argument("--steps", type=int, default=20, help="decode steps timed and profiled")
    pr.add_argument("--seed", type=int, default=0)
    add_config_args(pr, EngineConfig)

    bo = verb(
        "overlap",
        _bench_overlap,
        "share of KV transfer hidden by layer-wise streaming (vs transfer after prefill)",
        bench_verbs,
    )
    bo.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    bo.add_argument("--repeat", type=int, default=3)
    bo.add_argument("--seed", type=int, default=0)
    bo.add_argument("--segment-mib", type=int, default=1024, help="pool memory per engine")
    add_config_args(bo, EngineConfig)

    bx = verb(
        "prefix",
        _bench_prefix,
        "TTFT of a prompt whose prefix is in the pool, on another prefill worker, vs cold",
        bench_verbs,
    )
    bx.add_argument("--prefix", type=int, default=2048, help="shared prefix tokens")
    bx.add_argument("--tail", type=int, default=32, help="tokens after the prefix")
    bx.add_argument("--repeat", type=int, default=4)
    bx.add_argument("--seed", type=int, default=0)
    bx.add_argument("--segment-mib", type=int, default=512, help="pool memory per worker")
    add_config_args(bx, EngineConfig)

    from kvserve.bench.compare import add_arguments as add_compare_arguments
    from kvserve.bench.loadgen.options import add_arguments as add_serve_arguments
    from kvserve.bench.peer import add_arguments as add_peer_arguments
    from kvserve.bench.trace import add_arguments as add_trace_arguments

    add_serve_arguments(
        verb(
            "serve",
            _bench_serve,
            "serving load (any OpenAI-compatible server): latency, SLO attainment, goodput",
            bench_verbs,
        )
    )
    add_compare_arguments(
        verb(
            "compare",
            _bench_compare,
            "one workload on deployments it starts itself (1p1d vs 2m): goodput ratio",
            bench_verbs,
        )
    )
    add_peer_arguments(
        verb(
            "peer",
            _bench_peer,
            "kvserve side by side with vLLM's CPU build (installed on first use), same cores",
            bench_verbs,
        )
    )
    add_trace_arguments(
        verb(
            "trace",
            _bench_trace,
            "prefix hit rate of a Mooncake trace: real pool vs LRU, local caches vs shared",
            bench_verbs,
        )
    )

    from kvserve.sim.cli import add_parsers as add_sim_parsers

    add_sim_parsers(verbs.add_parser("sim", help="simulated cluster and P:D analyses (JSON)"))

    from kvserve.bench.shift import add_arguments as add_shift_arguments

    add_shift_arguments(
        verb(
            "shift",
            _bench_shift,
            "the P:D ratio controller live: a load that turns from prefill- to decode-heavy",
            bench_verbs,
        )
    )

    from kvserve.bench.pressure import add_arguments as add_pressure_arguments

    add_pressure_arguments(
        verb(
            "pressure",
            _bench_pressure,
            "hand-offs through a pool too small for the load: first-to-second-token gap, "
            "landing stall detection against the old fixed wait",
            bench_verbs,
        )
    )

    from kvserve.bench.hashing import add_arguments as add_hashing_arguments

    add_hashing_arguments(
        verb(
            "hashing",
            _bench_hashing,
            "cost of the keyed prefix chain and the block digests per 1,000 tokens vs prefill",
            bench_verbs,
        )
    )

    bp = verb("pool", _bench_pool, "KV pool put/get GB/s against memcpy", bench_verbs)
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (ValueError, FileNotFoundError) as exc:
        print(f"kvserve: error: {exc}", file=sys.stderr)
        return 2

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
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from kvpool.config import PoolConfig
from kvpool.master import MasterConfig
from kvserve.settings import (
    SettingError,
    add_config_args,
    add_verb,
    config_from_args,
    env_name,
)
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

    from kvserve.cluster.pool import MasterProcess

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


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def _logging(level: str) -> None:
    import logging

    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _confine(pool: PoolConfig, joins: bool) -> None:
    """Before anything else, confine this process's Mooncake listeners to its pool address
    (:mod:`kvpool.confine`; may re-execute the process) when it joins the pool."""
    if joins and pool.pool_confine:
        from kvpool.confine import confine
        from workers.model.prepare import cache_dir

        confine(pool.pool_local_hostname, cache_dir())


def _worker(args: argparse.Namespace) -> int:
    _logging(args.log_level)
    worker, pool = config_from_args(WorkerConfig, args), config_from_args(PoolConfig, args)
    _confine(pool, worker.use_pool)
    from workers.server import serve

    return serve(
        worker,
        config_from_args(EngineConfig, args),
        pool,
        config_from_args(ClusterConfig, args),
    )


def _router(args: argparse.Namespace) -> int:
    from router.config import RouterConfig

    _logging(args.log_level)
    router, pool = config_from_args(RouterConfig, args), config_from_args(PoolConfig, args)
    _confine(pool, router.pool_lookup)
    from router.main import serve

    serve(router, config_from_args(ClusterConfig, args), pool)
    return 0


def _up(args: argparse.Namespace) -> int:
    from kvserve.cluster.up import run

    return run(args)


def _chaos(args: argparse.Namespace) -> int:
    from kvserve.chaos.run import run

    return run(args)


def _grant(args: argparse.Namespace) -> int:
    """Print ``args.holder``'s grant cut from ``KVSERVE_CLUSTER_SECRET`` (never a flag: a
    secret on a command line is visible to every user of the machine)."""
    from proto.grants import grant

    secret = os.environ.get(env_name("cluster_secret"), "")
    if not secret:
        raise ValueError(f"set {env_name('cluster_secret')} to the cluster secret first")
    print(grant(secret, args.holder))
    return 0


def _probe(args: argparse.Namespace) -> int:
    from kvserve.cluster.probe import run

    return run(args)


GROUPS: dict[str, str] = {
    "chaos": "load on a loopback cluster while killing and restarting its parts",
    "bench": "benchmarks (one JSON object on stdout)",
    "sim": "simulated cluster and P:D analyses (JSON)",
}
"""Verbs whose arguments come from heavy modules (torch, openai): :func:`build_parser` adds
their arguments only when asked for the whole parser or for that verb."""


def _add_group(parser: argparse.ArgumentParser, name: str) -> None:
    """The arguments (and sub-verbs) of the :data:`GROUPS` verb ``name``."""
    if name == "chaos":
        from kvserve.chaos.run import add_arguments

        parser.set_defaults(func=_chaos)
        add_arguments(parser)
    elif name == "bench":
        from kvserve.bench.cli import add_parsers

        add_parsers(parser)
    else:
        from kvserve.sim.cli import add_parsers as add_sim_parsers

        add_sim_parsers(parser)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kvserve")
    except PackageNotFoundError:  # a source tree that was never installed
        return "unknown"


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with ``only`` (the verb about to be parsed, or ``""`` for
    none), the :data:`GROUPS` verbs other than ``only`` are listed without their arguments,
    so that a worker, the router or ``--help`` do not import what only benchmarks need."""
    parser = argparse.ArgumentParser(prog="kvserve", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"kvserve {_version()}")
    level = os.environ.get(env_name("log_level"), "INFO").upper()
    if level not in LOG_LEVELS:
        raise SettingError(f"{env_name('log_level')}={level!r} is not one of {LOG_LEVELS}")
    parser.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default=level,
        help=f"what a worker or the router logs (env {env_name('log_level')}; default INFO)",
    )
    verbs = parser.add_subparsers(dest="verb", required=True)

    def verb(
        name: str, fn: Callable[[argparse.Namespace], int], text: str
    ) -> argparse.ArgumentParser:
        return add_verb(verbs, name, fn, text)

    from kvserve.cluster.up import add_arguments as add_up_arguments
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
    add_config_args(pool, MasterConfig)
    for name, text in GROUPS.items():
        group = verbs.add_parser(name, help=text, description=text)
        if only is None or only == name:
            _add_group(group, name)
    from kvserve.cluster.probe import add_arguments as add_probe_arguments

    add_probe_arguments(
        verb("probe", _probe, "health check of a worker, router or pool service (0: healthy)")
    )

    from proto.grants import SCOPES

    verb(
        "grant",
        _grant,
        "print the KVSERVE_CLUSTER_SECRET value to give a worker, router or monitor instead "
        "of the whole secret (read from KVSERVE_CLUSTER_SECRET; see docs/security.md)",
    ).add_argument("holder", choices=sorted(SCOPES))

    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser(next((w for w in words if w in GROUPS), ""))
    except SettingError as exc:  # a malformed KVSERVE_* variable: one line naming it
        print(f"kvserve: error: {exc}", file=sys.stderr)
        return 2
    args = parser.parse_args(words)
    try:
        return int(args.func(args))
    except (ValueError, FileNotFoundError) as exc:
        print(f"kvserve: error: {exc}", file=sys.stderr)
        return 2

"""``kvserve worker``: serve one engine over gRPC (role prefill, decode or mixed): ours, or
vLLM's (``--engine vllm``: the command re-executes itself in vLLM's environment first,
:mod:`kvserve.vllm_env`, then checks :func:`vllm_backend.preflight.may_start` and runs
:func:`vllm_backend.server.serve`)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from kvpool.config import PoolConfig
from kvserve.settings import config_from_args
from kvserve.verbs import confine_first, start_logging
from proto.registry import ClusterConfig
from workers.config import EngineConfig, VllmOptions, WorkerConfig

SETTINGS = (WorkerConfig, EngineConfig, VllmOptions, PoolConfig, ClusterConfig)
log = logging.getLogger(__name__)


def run(args: argparse.Namespace) -> int:
    """Serve until stopped (confined to the pool address first when it joins the pool)."""
    start_logging(args.log_level)
    worker, pool = config_from_args(WorkerConfig, args), config_from_args(PoolConfig, args)
    engine, cluster = config_from_args(EngineConfig, args), config_from_args(ClusterConfig, args)
    if worker.engine == "vllm":
        from kvserve.vllm_env import enter, here, installed

        options = config_from_args(VllmOptions, args)
        if options.vllm_venv or not here():
            try:
                env = installed(Path(options.vllm_venv) if options.vllm_venv else None)
            except RuntimeError as exc:
                log.error("%s", exc)
                return 1
            enter(env)  # returns only inside vLLM's environment
        confine_first(pool, worker.use_pool)
        from vllm_backend.preflight import may_start

        if not may_start(worker, pool, cluster):  # in a second, before vLLM is imported
            return 1
        from vllm_backend.server import serve as serve_vllm

        return serve_vllm(worker, engine, options, pool, cluster)
    confine_first(pool, worker.use_pool)
    from workers.serve.server import serve

    return serve(worker, engine, pool, cluster)

"""The servers of ``kvserve bench peer`` (:data:`kvserve.bench.peer_results.SERVERS`),
started fresh and healthy, stopped on exit: plain ``vllm serve`` (one, or several behind
nginx's round-robin, :mod:`kvserve.bench.peer_lb`), or a kvserve cluster of our engine's or
vLLM's workers (:func:`kvserve.bench.compare.started`)."""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kvserve.bench import peer_results as pr
from kvserve.bench import peer_vllm as pv
from kvserve.report import log
from kvserve.vllm_env import VllmEnv
from workers.config import EngineConfig, VllmOptions


@contextlib.contextmanager
def server_up(
    args: argparse.Namespace,
    venv: VllmEnv,
    server: pr.Server,
    model_dir: Path,
    log_dir: Path,
) -> Iterator[str]:
    """``server`` serving ``model_dir``, healthy; yields its base URL, stops it on exit."""
    if server.plain_vllm:
        with plain_vllm(args, venv, server, model_dir, log_dir) as url:
            yield url
        return
    from kvserve.bench.compare import started

    engine = engine_config(args, model_dir)
    options = cluster_options(server, args.startup_timeout_s)
    if server.engine != "kvserve":
        options |= {"worker_engine": server.engine, "vllm": VllmOptions(vllm_venv=str(venv.root))}
    begin = time.monotonic()
    with started(server.deployment, engine, args.segment_mib, **options) as cluster:
        placement = {p.name: list(p.cores) for p in cluster.plan.workers}
        log(f"bench peer: kvserve {server.name} up in {time.monotonic() - begin:.0f}s at "
            f"{cluster.router_url} (worker cores {placement})")  # fmt: skip
        yield cluster.router_url


@contextlib.contextmanager
def plain_vllm(
    args: argparse.Namespace, venv: VllmEnv, server: pr.Server, model_dir: Path, log_dir: Path
) -> Iterator[str]:
    """``vllm serve`` with its defaults, or ``server.replicas`` of them, the engine of each
    bound to a core of its own, behind nginx's round-robin (:mod:`kvserve.bench.peer_lb`)."""
    servers = [
        pv.vllm_server(
            venv, model_dir, log_dir / f"vllm-{i}", kvcache_gib=args.vllm_kvcache_gib,
            max_model_len=args.vllm_max_model_len, startup_timeout_s=args.startup_timeout_s,
            environment={"VLLM_CPU_OMP_THREADS_BIND": str(core)} if server.replicas else None,
        )
        for i, core in enumerate(sorted(os.sched_getaffinity(0))[: max(1, server.replicas)])
    ]  # fmt: skip
    with contextlib.ExitStack() as stack:
        for folder in (log_dir / f"vllm-{i}" for i in range(len(servers))):
            folder.mkdir(parents=True, exist_ok=True)
        urls = [stack.enter_context(s) for s in servers]
        if not server.replicas:
            yield urls[0]
            return
        from kvserve.bench.peer_lb import round_robin

        yield stack.enter_context(round_robin(urls, log_dir))


def cluster_options(server: pr.Server, startup_timeout_s: float) -> dict[str, Any]:
    """The :class:`~kvserve.cluster.spec.ClusterSpec` fields of a kvserve server besides its
    shape: a server with ``threads`` gets that many threads per worker and only the first
    core of this process's affinity (the core vLLM pins its engine to)."""
    options: dict[str, Any] = {"startup_timeout_s": startup_timeout_s}
    if server.threads:
        options |= {"threads_per_worker": server.threads, "cores": (first_core(),)}
    return options


def first_core() -> int:
    return min(os.sched_getaffinity(0))


def engine_fields() -> list[str]:
    """:class:`EngineConfig`'s fields ``bench peer`` takes as flags (all but the model)."""
    import dataclasses

    return [f.name for f in dataclasses.fields(EngineConfig) if f.name != "model"]


def engine_config(args: argparse.Namespace, model_dir: Path) -> EngineConfig:
    """Every kvserve worker's engine settings: the flags, with ``model_dir``."""
    return EngineConfig(model=str(model_dir), **{f: getattr(args, f) for f in engine_fields()})

"""What one process of a cluster is: its exact command (:class:`ProcessPlan`; where it
runs: :class:`kvserve.cluster.host.Host`), the pure helpers that build commands from
settings dataclasses, and :func:`plan_cluster`, which turns a
:class:`~kvserve.cluster.spec.ClusterSpec` into every worker's and the router's
:class:`ProcessPlan`. The spec knows nothing of its plan: this module imports the spec.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kvserve.cluster.redis_acl import as_role
from kvserve.cluster.spec import ClusterSpec
from kvserve.settings import env_name
from proto.grants import grant
from proto.registry import ClusterConfig


def config_argv(config: Any) -> list[str]:
    """Every field of a settings dataclass as the flags :mod:`kvserve.settings` defines,
    except secrets (``repr=False`` fields: see :func:`secret_env`)."""
    argv: list[str] = []
    for f in dataclasses.fields(config):
        if not f.repr:
            continue
        flag, value = f.name.replace("_", "-"), getattr(config, f.name)
        if isinstance(value, bool):
            argv.append(f"--{flag}" if value else f"--no-{flag}")
        else:
            argv += [f"--{flag}", str(value)]
    return argv


def secret_env(config: Any) -> tuple[tuple[str, str], ...]:
    """The secret (``repr=False``) fields of a settings dataclass as ``KVSERVE_*``
    variables, empty ones included (so the launcher's own variables do not leak in)."""
    fields = dataclasses.fields(config)
    return tuple((env_name(f.name), str(getattr(config, f.name))) for f in fields if not f.repr)


def split_cores(cores: Sequence[int], n: int) -> tuple[list[tuple[int, ...]], bool]:
    """``n`` contiguous disjoint slices of ``cores`` (earlier ones get the remainder), or,
    with fewer cores than ``n``, all cores for everyone; the flag says whether they share."""
    ordered = sorted(cores)
    if len(ordered) < n:
        return [tuple(ordered)] * n, True
    base, extra = divmod(len(ordered), n)
    slices, start = [], 0
    for k in range(n):
        size = base + (1 if k < extra else 0)
        slices.append(tuple(ordered[start : start + size]))
        start += size
    return slices, False


@dataclass(frozen=True)
class ProcessPlan:
    """One process to run: exact argv, the address it serves on, cores to pin it to."""

    name: str
    role: str
    argv: tuple[str, ...]
    host: str
    port: int
    cores: tuple[int, ...] = ()
    env: tuple[tuple[str, str], ...] = field(default=(), repr=False)  # may hold secrets
    prefix: tuple[str, ...] = ()
    """Runs ``argv`` on its host (:attr:`Host.prefix`)."""
    metrics_port: int = 0
    """A worker's Prometheus ``/metrics`` port on ``host`` (0: none)."""

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def metrics_url(self) -> str:
        """Its ``/metrics`` URL ('' without a metrics port)."""
        return f"http://{self.host}:{self.metrics_port}/metrics" if self.metrics_port else ""


@dataclass(frozen=True)
class ClusterPlan:
    """Every worker's and every router's plan (:func:`plan_cluster`)."""

    workers: tuple[ProcessPlan, ...]
    routers: tuple[ProcessPlan, ...]
    shared_cores: bool
    notes: tuple[str, ...]

    @property
    def router(self) -> ProcessPlan:
        """The first router's plan (the only one's, with one router)."""
        return self.routers[0]


def plan_cluster(spec: ClusterSpec, cores: Sequence[int] | None = None) -> ClusterPlan:
    """Exact argv, port, cores and own environment of every worker and of the router (pure
    given the cores: ``cores`` defaults to ``spec.cores``, then to this process's
    affinity): each worker gets a disjoint slice of the cores when there are at least as
    many cores as workers (else all share all, and a note says so). Every setting is a
    flag; the secrets go in the environment (:func:`secret_env`): each worker and the
    router a grant of its role cut from the cluster secret (:mod:`proto.grants`), never
    the secret itself; the API keys to the router alone."""
    ordered = list(cores or spec.cores or sorted(os.sched_getaffinity(0)))
    slices, shared = split_cores(ordered, spec.num_workers)
    auto_threads = max(1, len(ordered) // spec.num_workers)
    notes = []
    if shared and spec.pin_cores:
        notes.append(
            f"{spec.num_workers} workers share {len(ordered)} cores {ordered} "
            f"(fewer cores than workers): {auto_threads} thread(s) each"
        )
    ports = spec.named_ports()
    workers = []
    for i, ((name, role), mine) in enumerate(zip(spec.worker_roles(), slices, strict=True)):
        pinned = spec.pin_cores and not shared
        threads = spec.threads_per_worker or spec.engine.threads
        threads = threads or (len(mine) if pinned else auto_threads)
        cores_of = mine if spec.pin_cores else ()
        plan = worker_plan(spec, name, role, ports[name], cores_of, threads)
        metrics = spec.worker_metrics_port(i)
        if metrics:
            argv = (*plan.argv, "--worker-metrics-port", str(metrics))
            plan = dataclasses.replace(plan, argv=argv, metrics_port=metrics)
        workers.append(plan)
    return ClusterPlan(tuple(workers), _router_plans(spec), shared, tuple(notes))


def role_cluster(spec: ClusterSpec, role: str) -> ClusterConfig:
    """The cluster settings a ``role`` process gets: the secret cut down to the role's grant
    (:mod:`proto.grants`) and the role's own Redis user (:mod:`kvserve.cluster.redis_acl`)."""
    cluster = as_role(spec.cluster_config, role)
    return dataclasses.replace(cluster, cluster_secret=grant(spec.cluster.cluster_secret, role))


def _own_env(cluster: ClusterConfig, *own: tuple[str, str]) -> tuple[tuple[str, str], ...]:
    """A worker's or the router's own environment: unbuffered output, the secrets of its
    ``cluster`` settings (:func:`role_cluster`), then ``own``."""
    return (("PYTHONUNBUFFERED", "1"), *secret_env(cluster), *own)


def worker_plan(
    spec: ClusterSpec, name: str, role: str, port: int, cores: tuple[int, ...], threads: int
) -> ProcessPlan:
    """Worker ``name``'s argv and environment in ``role`` on ``port``, pinned to ``cores``
    with ``threads`` threads (its grant of the cluster secret in the environment)."""
    engine = dataclasses.replace(spec.engine, threads=threads)
    pool = config_argv(spec.pool_config(name)) if spec.use_pool else ["--no-use-pool"]
    host = spec.host_of(name)
    argv = [spec.python, "-m", "kvserve", "worker", "--role", role]
    argv += ["--worker-host", host, "--worker-port", str(port), "--worker-id", name]
    cluster = role_cluster(spec, "worker")
    argv += [*config_argv(engine), *pool, *config_argv(cluster)]
    if spec.worker_engine != "kvserve":
        argv += ["--engine", spec.worker_engine, *config_argv(spec.vllm)]
    argv += spec.worker_args
    env = _own_env(cluster, ("OMP_NUM_THREADS", str(threads)))
    return ProcessPlan(name, role, tuple(argv), host, port, cores, env, spec.prefix_of(name))


def _router_plans(spec: ClusterSpec) -> tuple[ProcessPlan, ...]:
    """Every router's plan, each with its own port and ``--router-id`` (its name)."""
    ports = spec.router_ports or (spec.router_port,)
    names = spec.router_names()
    return tuple(_router_plan(spec, n, p) for n, p in zip(names, ports, strict=True))


def _router_plan(spec: ClusterSpec, name: str, port: int) -> ProcessPlan:
    host = spec.host_of(name)
    argv = [spec.python, "-m", "kvserve", "router", "--router-host", host]
    argv += ["--router-port", str(port), "--router-id", name]
    front = spec.host_of("router")  # never every interface: the spec checks refuse that
    if front != host:  # behind the balancer elsewhere: clients' Host headers name the front
        argv += ["--allowed-hosts", front]
    cluster = role_cluster(spec, "router")
    argv += config_argv(cluster)
    if spec.use_pool:
        argv += config_argv(spec.pool_config(name))
    else:
        argv += ["--no-pool-lookup"]
    if spec.policy:
        argv += ["--policy", spec.policy]
    if spec.disagg_threshold_tokens is not None:
        argv += ["--disagg-threshold-tokens", str(spec.disagg_threshold_tokens)]
    argv += ["--tokenizer-dir", spec.model_dir]  # its own setting, never the registry's
    env = _own_env(cluster, (env_name("api_key"), spec.api_key))
    argv += spec.router_args
    return ProcessPlan(name, "router", tuple(argv), host, port, (), env, spec.prefix_of(name))

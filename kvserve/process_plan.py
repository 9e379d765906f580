"""What one process of a cluster is: where it runs (:class:`Host`), its exact command
(:class:`ProcessPlan`), and the pure helpers that build commands from settings dataclasses.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kvserve.settings import env_name


@dataclass(frozen=True)
class Host:
    """Where a process runs: the address it binds to and advertises, and the argv prefix
    that starts a command there (empty: this machine's own network, e.g.
    ``("ip", "netns", "exec", "kvs-redis")`` for a network namespace)."""

    address: str
    prefix: tuple[str, ...] = ()


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

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class ClusterPlan:
    workers: tuple[ProcessPlan, ...]
    router: ProcessPlan
    shared_cores: bool
    notes: tuple[str, ...]

"""Where one process of a cluster runs: :class:`Host`. Pure.

Shared by the spec that places processes on hosts (:mod:`kvserve.cluster.spec`), the plans
that start them there (:mod:`kvserve.cluster.plan`) and the network hosts that provide them
(:mod:`kvserve.cluster.netns`); it imports none of them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Host:
    """Where a process runs: the address it binds to and advertises, and the argv prefix
    that starts a command there (empty: this machine's own network, e.g.
    ``("ip", "netns", "exec", "kvs-redis")`` for a network namespace)."""

    address: str
    prefix: tuple[str, ...] = ()

"""The cluster's Redis with no single point of failure: a primary, a replica and three
Sentinels (:class:`RedisHA`), addressed by clients as ``redis+sentinel://`` (:mod:`proto.sentinel`).

Lifecycle: ``start()`` spawns the primary, the replica (``--replicaof`` the primary) and the
Sentinels, and returns once the replica is in sync and every Sentinel knows the replica and
the other Sentinels (so a failover can start at once) -> the cluster runs; a data node that
dies is failed over by the Sentinels within about ``DOWN_AFTER_MS`` plus an election (about
2 s here), and :meth:`restart_node` brings it back as a replica of the current primary ->
``stop()`` stops the Sentinels first (no failover during the shutdown), then the nodes.

Credentials: the data nodes read theirs from standard input, as :class:`RedisProcess` does
(:func:`~kvserve.cluster.redis.redis_auth_conf`, with the ``replica`` and ``sentinel`` users
of :mod:`kvserve.cluster.redis_acl`, and ``masteruser``/``masterauth`` so each can replicate
from the other as ``replica``). The Sentinels reach the nodes and each other as
``sentinel``. A Sentinel must be able to rewrite its configuration file, so its credentials
are in that file: written with mode 0600 into the launcher's log directory.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Sequence
from pathlib import Path

import redis

from kvserve.cluster.processes import ManagedProcess, Readiness
from kvserve.cluster.redis import (
    RedisConfig,
    admin_conf,
    answers_ping,
    ask,
    redis_auth_conf,
    redis_binary,
    redis_command,
)
from kvserve.cluster.redis_acl import (
    REPLICA,
    SENTINEL,
    conf_quoted,
    role_password,
    sentinel_users,
)
from proto.registry import ClusterConfig
from proto.sentinel import SentinelURL

SERVICE = "kvserve"
"""The name the Sentinels monitor the primary under."""
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 3000
QUORUM = 2
HA_PORTS = 4
"""The ports :class:`RedisHA` takes beside the primary's: its replica's, then 3 Sentinels'."""


def sentinel_url(cfg: RedisConfig, sentinel_ports: Sequence[int]) -> str:
    """Where clients find the primary of ``cfg``'s cluster: its Sentinels and the service."""
    return str(SentinelURL(tuple((cfg.host, port) for port in sentinel_ports), SERVICE))


def node_command(
    cfg: RedisConfig, binary: str, primary_port: int | None, data_dir: Path
) -> list[str]:
    """A data node's argv: :func:`redis_command`'s, a replica of ``primary_port`` if given.
    Replication is diskless both ways, and the RDB file Redis would still read at start is
    its own (``data_dir``/``redis-PORT.rdb``), never one in the working directory."""
    argv = [a for a in redis_command(cfg, binary) if a != "-"]
    argv += ["--dir", str(data_dir), "--dbfilename", f"redis-{cfg.port}.rdb"]
    argv += ["--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0"]
    argv += ["--repl-diskless-load", "on-empty-db"]
    if primary_port is not None:
        argv += ["--replicaof", cfg.host, str(primary_port)]
    return [*argv, "-"] if cfg.password else argv


def node_auth_conf(cfg: RedisConfig) -> str:
    """A data node's credential lines: the administrator's and every role's (the
    replication and Sentinel users too), and the ``replica`` user it replicates as."""
    if not cfg.password:
        return ""
    secret = conf_quoted(role_password(cfg.password, REPLICA))
    return redis_auth_conf(cfg, ha=True) + f"masteruser {REPLICA}\nmasterauth {secret}\n"


def sentinel_conf(cfg: RedisConfig, port: int, bind: str = "", hostnames: bool = False) -> str:
    """A Sentinel's configuration: it listens on ``port`` of ``bind`` (default ``cfg.host``)
    and watches ``cfg``'s primary; ``hostnames``: ``cfg.host`` is a name to resolve (a
    compose service's), not an address."""
    lines = [
        f"port {port}",
        f"bind {bind or cfg.host}",
        *(["sentinel resolve-hostnames yes"] if hostnames else []),
        f"sentinel monitor {SERVICE} {cfg.host} {cfg.port} {QUORUM}",
        f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}",
        f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}",
    ]
    if cfg.password:  # the Sentinels reach the data nodes, and each other, as SENTINEL
        secret = conf_quoted(role_password(cfg.password, SENTINEL))
        lines += [f"sentinel auth-user {SERVICE} {SENTINEL}"]
        lines += [f"sentinel auth-pass {SERVICE} {secret}"]
        lines += [f"sentinel sentinel-user {SENTINEL}", f"sentinel sentinel-pass {secret}"]
    users = admin_conf(cfg) + sentinel_users(cfg.password) if cfg.password else ""
    return "\n".join(lines) + "\n" + users


def in_sync(cfg: RedisConfig) -> bool:
    """Whether the replica of ``cfg`` answers and its link to its primary is up."""
    state = ask(cfg, lambda client: client.info("replication"))
    return isinstance(state, dict) and state.get("master_link_status") == "up"


class RedisHA:
    """A primary on ``cfg.port``, a replica on ``replica_port`` and a Sentinel on each of
    ``sentinel_ports`` (see the module docstring); logs and Sentinel files in ``log_dir``."""

    def __init__(
        self,
        cfg: RedisConfig,
        replica_port: int,
        sentinel_ports: Sequence[int],
        log_dir: Path,
        prefix: Sequence[str] = (),
    ) -> None:
        if len(sentinel_ports) < QUORUM + 1:
            raise ValueError(f"Redis HA needs at least {QUORUM + 1} Sentinels")
        self.cfg = cfg
        self.sentinel_ports = tuple(sentinel_ports)
        self.log_dir = log_dir
        self._prefix = tuple(prefix)
        self._binary = redis_binary()
        self.nodes = {
            cfg.port: self._node(cfg.port, None),
            replica_port: self._node(replica_port, cfg.port),
        }
        self.sentinels = [self._sentinel(port) for port in self.sentinel_ports]

    @property
    def url(self) -> str:
        """Where clients find the primary: the Sentinels and the service."""
        return sentinel_url(self.cfg, self.sentinel_ports)

    @property
    def cluster_config(self) -> ClusterConfig:
        return ClusterConfig(
            redis_url=self.url,
            redis_username=self.cfg.username,
            redis_password=self.cfg.password,
        )

    def _at(self, port: int) -> RedisConfig:
        return dataclasses.replace(self.cfg, port=port)

    def _node(self, port: int, primary_port: int | None) -> ManagedProcess:
        cfg = self._at(port)
        auth = node_auth_conf(cfg).encode() if cfg.password else None
        if primary_port is None:
            ready = Readiness(lambda: answers_ping(cfg), f"did not answer PING on port {port}")
        else:
            ready = Readiness(lambda: in_sync(cfg), f"did not sync from port {primary_port}")
        argv = node_command(cfg, self._binary, primary_port, self.log_dir)
        log = self.log_dir / f"redis-{port}.log"
        return ManagedProcess(
            f"redis-{port}", argv, log, prefix=self._prefix, stdin=auth, ready=ready, grace=5.0
        )

    def _sentinel(self, port: int) -> ManagedProcess:
        path = self.log_dir / f"sentinel-{port}.conf"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as conf:
            conf.write(sentinel_conf(self.cfg, port))
        argv = [self._binary, str(path), "--sentinel"]
        log = self.log_dir / f"sentinel-{port}.log"
        return ManagedProcess(f"sentinel-{port}", argv, log, prefix=self._prefix)

    def _sees_everyone(self, port: int) -> bool:
        """Whether the Sentinel on ``port`` knows a replica and every other Sentinel."""
        state = ask(
            self._at(port), lambda client: client.sentinel_master(SERVICE), (redis.ResponseError,)
        )
        if not isinstance(state, dict):
            return False
        others = len(self.sentinel_ports) - 1
        return int(state["num-slaves"]) >= 1 and int(state["num-other-sentinels"]) >= others

    def start(self, timeout: float = 30.0) -> RedisHA:
        for node in self.nodes.values():
            node.start(timeout)
        for sentinel in self.sentinels:  # all of them first: each waits to see the others
            sentinel.start(timeout)
        for port, sentinel in zip(self.sentinel_ports, self.sentinels, strict=True):
            seen = Readiness(
                lambda port=port: self._sees_everyone(port),  # type: ignore[misc]
                "did not see the replica and every other Sentinel",
            )
            sentinel.wait_ready(seen, timeout)
        return self

    def named_primary(self) -> int | None:
        """:meth:`primary_port`, or None while no Sentinel names one."""
        try:
            return self.primary_port()
        except RuntimeError:
            return None

    def primary_port(self) -> int:
        """The port of the node the Sentinels name primary now."""
        for port in self.sentinel_ports:
            address = ask(
                self._at(port), lambda client: client.sentinel_get_master_addr_by_name(SERVICE)
            )
            if isinstance(address, (tuple, list)) and len(address) == 2:
                return int(address[1])
        raise RuntimeError("no Sentinel named a primary")

    @property
    def process(self) -> ManagedProcess:
        """The primary's process now (what a fault that kills "redis" kills)."""
        return self.nodes[self.primary_port()]

    def restart(self, grace: float | None, timeout: float) -> None:
        """Bring back what is down: each data node that exited, as a replica of the
        primary now (the Sentinels must have failed over first), and each Sentinel."""
        for port, node in list(self.nodes.items()):
            if not node.running:
                self.restart_node(port, timeout)
        for sentinel in self.sentinels:
            if not sentinel.running:
                sentinel.start(timeout)

    def restart_node(self, port: int, timeout: float = 30.0) -> None:
        """Start the data node on ``port`` again (it comes back empty) as a replica of the
        primary the Sentinels name now."""
        deadline = time.monotonic() + timeout
        while (primary := self.primary_port()) == port:  # until the Sentinels fail it over
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Sentinels still name redis-{port} the primary")
            time.sleep(0.1)
        old = self.nodes[port]
        old.stop()
        self.nodes[port] = self._node(port, primary)
        self.nodes[port].start(timeout)

    @property
    def processes(self) -> list[ManagedProcess]:
        return [*self.nodes.values(), *self.sentinels]

    def stop(self, grace: float | None = None) -> None:
        for process in [*self.sentinels, *self.nodes.values()]:
            process.stop(grace)

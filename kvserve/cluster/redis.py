"""The cluster's Redis (the worker registry): :class:`RedisConfig` says where it listens and
who may use it, :class:`RedisProcess` runs ``redis-server`` as a
:class:`~kvserve.cluster.processes.ManagedProcess` whose readiness is :func:`answers_ping`
(with those credentials). Its lifecycle is the managed process's: ``start()`` returns once
it answers PING (or stops it and raises naming the log) -> ``stop()`` (SIGTERM, SIGKILL
after 5 s by default) -> ``start()`` again comes back empty (nothing is persisted).
"""

from __future__ import annotations

import ipaddress
import re
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import redis

from kvserve.cluster.processes import ManagedProcess, Readiness, debian_binary
from kvserve.cluster.redis_acl import ROLES, check_cluster_name, conf_quoted, node_users
from proto.registry import ClusterConfig, connect

_REDIS_USER = re.compile(r"[A-Za-z0-9_.@-]+")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an IP address or ``localhost``) is this machine's loopback."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class RedisConfig:
    """Where the cluster's Redis listens (loopback by default) and who may use it.

    ``password`` empty means no authentication, allowed on loopback only (Redis's protected
    mode refuses other hosts then, so that is an error here); with a password and no
    ``username`` it is Redis's ``requirepass``; with a ``username`` too, that ACL user gets
    every command and key and the ``default`` user is switched off. The password never
    reaches a command line nor the disk: redis-server reads it from its standard input
    (:func:`redis_command`), clients get it through :func:`proto.registry.connect`.
    :func:`new_password` makes one up (launchers do, unless one is given).
    """

    host: str = "127.0.0.1"
    port: int = 6379
    password: str = field(default="", repr=False)
    username: str = ""
    cluster: str = ClusterConfig.cluster

    def __post_init__(self) -> None:
        check_cluster_name(self.cluster)
        if self.username in ROLES:
            raise ValueError(
                f"Redis user {self.username!r} is a role's own user (kvserve.cluster."
                f"redis_acl); name the administrator otherwise, or leave it empty"
            )
        if self.username and not self.password:
            raise ValueError(f"Redis user {self.username!r} needs a password (redis_password)")
        if self.username and not _REDIS_USER.fullmatch(self.username):
            raise ValueError(
                f"a Redis user name is letters, digits and _.@-, got {self.username!r}"
            )
        if any(c in self.password for c in "\r\n\0"):
            raise ValueError("the Redis password must not contain line breaks or NUL")
        if not self.password and not is_loopback(self.host):
            raise ValueError(
                f"Redis on {self.host} is reachable from other hosts: set a password "
                f"(redis_password; kvserve up makes one up when none is given)"
            )

    @property
    def url(self) -> str:
        """``redis://host:port/0``, without credentials (those travel separately)."""
        return f"redis://{self.host}:{self.port}/0"

    @property
    def cluster_config(self) -> ClusterConfig:
        """A registry config that reaches this Redis with its credentials."""
        return ClusterConfig(
            redis_url=self.url, redis_username=self.username, redis_password=self.password
        )


def redis_binary() -> str:
    return debian_binary("redis-server", "redis-server")


def new_password() -> str:
    """A fresh Redis password (192 random bits, URL-safe base64)."""
    return secrets.token_urlsafe(24)


def redis_command(cfg: RedisConfig, binary: str = "redis-server") -> list[str]:
    """A throwaway Redis: no snapshots, no append-only file, protected mode on; with
    credentials, the last argument ``-`` makes it read them, as config lines
    (:func:`redis_auth_conf`), from its standard input."""
    argv = [binary, "--port", str(cfg.port), "--bind", cfg.host, "--save", ""]
    argv += ["--appendonly", "no", "--protected-mode", "yes"]
    return [*argv, "-"] if cfg.password else argv


def redis_auth_conf(cfg: RedisConfig, ha: bool = False) -> str:
    """The redis.conf lines that set ``cfg``'s credentials, the administrator's and each
    role's, ('' without a password); ``ha``: the replication and Sentinel users too."""
    if not cfg.password:
        return ""
    return admin_conf(cfg) + node_users(cfg.password, cfg.cluster, ha)


def admin_conf(cfg: RedisConfig) -> str:
    """The administrator's lines: ``requirepass`` (the ``default`` user), or ``username``
    with every command and ``default`` switched off."""
    if not cfg.username:
        return f"requirepass {conf_quoted(cfg.password)}\n"
    lines = [] if cfg.username == "default" else ["user default off"]
    lines.append(f"user {cfg.username} on {conf_quoted('>' + cfg.password)} ~* &* +@all")
    return "\n".join(lines) + "\n"


def ask(
    cfg: RedisConfig,
    command: Callable[[redis.Redis], Any],
    tolerated: tuple[type[Exception], ...] = (),
) -> Any:
    """One command (``command(client)``) to the Redis of ``cfg`` over a short-lived client
    with ``cfg``'s credentials and 0.5 s timeouts; ``None`` if it cannot be reached now (or
    answers with one of ``tolerated``)."""
    caught: tuple[type[Exception], ...] = (redis.ConnectionError, redis.TimeoutError, *tolerated)
    client = connect(cfg.cluster_config, socket_timeout=0.5, socket_connect_timeout=0.5)
    try:
        return command(client)
    except caught:
        return None
    finally:
        client.close()


def answers_ping(cfg: RedisConfig) -> bool:
    """Whether the Redis of ``cfg`` answers PING now, with ``cfg``'s credentials."""
    return bool(ask(cfg, lambda client: client.ping()))


class RedisProcess:
    """``redis-server`` for one cluster: its argv and credentials (on stdin) and its
    readiness (:func:`answers_ping`) for a :class:`ManagedProcess`, :attr:`process`."""

    def __init__(self, cfg: RedisConfig, log_path: Path, prefix: Sequence[str] = ()) -> None:
        self.cfg = cfg
        argv = redis_command(cfg, redis_binary())
        auth = redis_auth_conf(cfg).encode() if cfg.password else None
        ready = Readiness(lambda: answers_ping(cfg), f"did not answer PING on port {cfg.port}")
        self.process = ManagedProcess(
            "redis", argv, log_path, prefix=prefix, stdin=auth, ready=ready, grace=5.0
        )

    def start(self, timeout: float = 20.0) -> RedisProcess:
        self.process.start(timeout)
        return self

    @property
    def url(self) -> str:
        return self.cfg.url

    @property
    def cluster_config(self) -> ClusterConfig:
        return self.cfg.cluster_config

    @property
    def running(self) -> bool:
        return self.process.running

    @property
    def processes(self) -> list[ManagedProcess]:
        return [self.process]

    def restart(self, grace: float | None, timeout: float) -> None:
        """Stop it (if it runs) and start it again: it comes back empty."""
        self.process.stop(grace)
        self.process.start(timeout)

    def stop(self, grace: float | None = None) -> None:
        self.process.stop(grace)

    def __enter__(self) -> RedisProcess:
        return self.start() if not self.running else self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

"""The registry behind Redis Sentinel: the ``redis+sentinel://`` form of ``redis_url``.

``redis+sentinel://HOST:PORT[,HOST:PORT...]/SERVICE[/DB]`` names the Sentinels that watch a
primary and its replicas, and the name they monitor it under (``sentinel monitor SERVICE
...``). A client made by :func:`sentinel_client` asks the Sentinels for the primary's address
on every new connection, so after a failover its next command reaches the new primary (the
command in flight when the old one died fails; redis-py's retry covers a refused
connection). The Sentinels take the same credentials as the data nodes
(``redis_username`` / ``redis_password``); the URL carries none, and no TLS (a ``rediss://``
registry is addressed directly).

What a failover can lose: Redis replicates asynchronously, so writes the old primary
acknowledged in its last moments may be missing on the new one. The registry's records and
load reports are republished every heartbeat; KV events and chain-index entries lost that way
cost cache hits (a block the router does not know of, an eviction decided on a stale index),
never a wrong token (pool blocks are verified by their MACs and digests on every load).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import redis
from redis.sentinel import Sentinel

SCHEME = "redis+sentinel://"
_SERVICE = re.compile(r"[A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class SentinelURL:
    """A parsed ``redis+sentinel://`` URL: the Sentinels, the service name, the database."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0

    @staticmethod
    def matches(url: str) -> bool:
        return url.startswith(SCHEME)

    @classmethod
    def parse(cls, url: str) -> SentinelURL:
        """``url`` parsed; ``ValueError`` naming what is wrong (no Sentinel, a bad port, no
        service, credentials in it)."""
        if not cls.matches(url):
            raise ValueError(f"not a {SCHEME} URL: {url!r}")
        rest = url[len(SCHEME) :]
        hosts, _, path = rest.partition("/")
        if "@" in hosts or "?" in url:
            raise ValueError(
                f"{SCHEME} URLs carry no credentials or options: give the password as "
                f"KVSERVE_REDIS_PASSWORD (the Sentinels take the data nodes' credentials)"
            )
        sentinels = tuple(_host_port(part, url) for part in hosts.split(","))
        service, _, db = path.partition("/")
        if not _SERVICE.fullmatch(service):
            raise ValueError(f"{url!r}: name the monitored service after the hosts (/SERVICE)")
        if db and not db.isdigit():
            raise ValueError(f"{url!r}: the database after the service is a number, got {db!r}")
        return cls(sentinels, service, int(db or 0))

    def __str__(self) -> str:
        hosts = ",".join(f"{host}:{port}" for host, port in self.sentinels)
        return f"{SCHEME}{hosts}/{self.service}/{self.db}"


def _host_port(part: str, url: str) -> tuple[str, int]:
    host, sep, port = part.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{url!r}: each Sentinel is HOST:PORT, got {part!r}")
    return host.strip("[]"), int(port)


def sentinel_client(
    target: SentinelURL,
    credentials: dict[str, str],
    socket_timeout: float | None,
    socket_connect_timeout: float | None,
    options: dict[str, Any],
) -> redis.Redis:
    """A client of the primary ``target``'s Sentinels name now, and after each failover.
    ``credentials`` (``username``/``password``) go to the Sentinels and the data nodes;
    ``options`` (e.g. ``retry``) to the data nodes' connections."""
    timeouts = {"socket_timeout": socket_timeout, "socket_connect_timeout": socket_connect_timeout}
    sentinel = Sentinel(  # type: ignore[no-untyped-call]
        list(target.sentinels),
        sentinel_kwargs={**credentials, **timeouts},
        **timeouts,
    )
    client: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call]
        target.service, db=target.db, **credentials, **options
    )
    return client

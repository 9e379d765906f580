"""The worker registry in Redis: the second contract between workers and the router.

Keys (``<cluster>`` is the cluster name, ``kvserve`` by default):

- ``<cluster>:worker:<worker id>``: a JSON :class:`WorkerRecord`, written by the worker on
  every heartbeat with a TTL of ``ttl_s``; a worker that stops heartbeating disappears;
- ``<cluster>:contract``: the cluster's KV contract (namespace and KV layout, which fix the
  pool's key space). The first worker sets it; a worker whose contract differs is refused
  (:class:`ContractMismatchError`). Heartbeats refresh its TTL, so it expires with the
  last worker and a restarted cluster may serve another model.

Every record and the contract carry a MAC keyed with the cluster secret, and every record
read must pass the schema: readers drop the others (:mod:`proto.record_store`, whose names
this module re-exports; the schema is :mod:`proto.records`).

Only JSON goes through Redis (no pickle). Both sides import this module; neither imports
the other's package.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from kvpool.keyring import Keyring
from proto.credentials import Credentials, NotGrantedError
from proto.record_store import (
    ContractMismatchError,
    Keys,
    Listing,
    claim_contract,
    list_workers,
    open_record,
    publish,
    read_workers,
    seal_record,
    withdraw,
)
from proto.records import ROLES, RecordError, WorkerRecord
from proto.refusals import Rejection, RejectLog
from proto.sentinel import SentinelURL, sentinel_client
from proto.trust import POOL_BLOCK, PREFIX_ROOT, REGISTRY_RECORD

UNSHARED_KEY = secrets.token_bytes(32)
"""This process's own stand-in for a key it was not granted (see ``ClusterConfig.keyring``)."""

__all__ = [
    "HASH_ALGORITHMS",
    "ROLES",
    "ClusterConfig",
    "ContractMismatchError",
    "Keys",
    "Listing",
    "RecordError",
    "RegistryAccessError",
    "RejectLog",
    "Rejection",
    "WorkerRecord",
    "check",
    "claim_contract",
    "connect",
    "explain",
    "list_workers",
    "open_record",
    "publish",
    "read_workers",
    "seal_record",
    "withdraw",
]

HASH_ALGORITHMS = ("sha256", "xxh3")
"""Prefix-chain and layer-digest algorithms (:attr:`ClusterConfig.hash_algorithm`)."""


@dataclass(frozen=True)
class ClusterConfig:
    """How a process finds its cluster and its peers (flags ``--redis-url`` etc., env
    ``KVSERVE_*``); workers, the router and the launcher share it, so every setting below
    has one definition and one spelling.

    Registry (Redis):

    - ``redis_url``: the registry (``redis://host:port/db``; ``rediss://`` for TLS;
      ``redis+sentinel://host:port[,host:port...]/service[/db]`` for a primary its
      Sentinels name, found again after a failover: :mod:`proto.sentinel`);
    - ``redis_username`` / ``redis_password``: credentials (an ACL user, or just the
      password of Redis's ``requirepass``); empty means none. Give the password as the
      environment variable ``KVSERVE_REDIS_PASSWORD`` rather than the flag, so it stays out
      of process lists; it is left out of this config's ``repr`` and out of log lines. They
      may not be combined with credentials inside ``redis_url`` (one place for a secret);
    - ``cluster``: key prefix, so several clusters can share one Redis;
    - ``heartbeat_s``: how often a worker re-publishes its record and load;
    - ``heartbeat_ttl_s``: a record expires this long after its last heartbeat, so the
      router stops routing to a silent worker within this time.

    gRPC between router and workers (:mod:`proto.channels` turns these into options):

    - ``peer_timeout_s``: a peer that stops answering HTTP/2 keepalive pings (a frozen
      process, a dead host, a cut link) fails its calls with UNAVAILABLE within about this
      long; one value for the whole cluster;
    - ``grpc_tls_cert`` / ``grpc_tls_key``: PEM paths of this process's certificate and key
      (a worker serves TLS with them; a router presents them as its client certificate);
    - ``grpc_tls_ca``: PEM path of the CA that signs the peers' certificates: clients verify
      workers with it and workers then require client certificates signed by it (mutual
      TLS). All three empty: plaintext gRPC (fine on loopback or a private network).

    Trust (:mod:`proto.trust`; the threat model is ``docs/security.md``):

    - ``cluster_secret``: the secret every process of one cluster shares, or a grant cut
      from it for this process's role (:mod:`proto.credentials`, :mod:`proto.grants`; give
      it as ``KVSERVE_CLUSTER_SECRET``; left out of ``repr`` and logs). Worker gRPC calls
      carry a token derived from it, pool blocks and registry records a MAC, and prefix
      hash chains start from a root keyed with it. Empty: none of that protects anything
      (a process started by hand for a test); ``kvserve up`` and the compose files always
      set one, and hand each worker and the router a grant rather than the secret;
    - ``hash_algorithm``: ``sha256`` (the default: SHA-256 prefix chains and SHA-256 layer
      digests in pool blocks, collision resistant) or ``xxh3`` (xxh3-128 chains and xxh3-64
      layer checksums: faster, for a single-tenant cluster whose pool members are all
      trusted). Every process of a cluster must use the same (it is part of the contract).
    """

    redis_url: str = "redis://127.0.0.1:6379/0"
    cluster: str = "kvserve"
    heartbeat_s: float = 1.0
    heartbeat_ttl_s: float = 3.0
    redis_username: str = ""
    redis_password: str = field(default="", repr=False)
    peer_timeout_s: float = 5.0
    grpc_tls_cert: str = ""
    grpc_tls_key: str = ""
    grpc_tls_ca: str = ""
    cluster_secret: str = field(default="", repr=False)
    hash_algorithm: str = field(default="sha256", metadata={"choices": HASH_ALGORITHMS})

    def __post_init__(self) -> None:
        if SentinelURL.matches(self.redis_url):
            SentinelURL.parse(self.redis_url)  # raises, naming what is wrong
        elif not self.redis_url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(
                f"redis_url must be a redis:// (or redis+sentinel://) URL, got {self.redis_url!r}"
            )
        if (self.redis_username or self.redis_password) and _url_has_credentials(self.redis_url):
            raise ValueError(
                "redis_url carries credentials and redis_username/redis_password are set too: "
                "keep them in one place (preferably KVSERVE_REDIS_PASSWORD)"
            )
        if not self.cluster or ":" in self.cluster:
            raise ValueError(f"cluster must be a non-empty name without ':', got {self.cluster!r}")
        if not 0 < self.heartbeat_s < self.heartbeat_ttl_s:
            raise ValueError("need 0 < heartbeat_s < heartbeat_ttl_s")
        if not self.peer_timeout_s > 0:
            raise ValueError(f"peer_timeout_s must be positive, got {self.peer_timeout_s}")
        _check_tls_files(self.grpc_tls_cert, self.grpc_tls_key, self.grpc_tls_ca)
        Credentials.of(self.cluster_secret)  # raises, naming the setting, when malformed
        if self.hash_algorithm not in HASH_ALGORITHMS:
            raise ValueError(
                f"hash_algorithm must be one of {', '.join(HASH_ALGORITHMS)}, "
                f"got {self.hash_algorithm!r}"
            )

    @property
    def credentials(self) -> Credentials:
        """What ``cluster_secret`` holds (the secret, a grant, or nothing)."""
        return Credentials.of(self.cluster_secret)

    @property
    def keys(self) -> Keys:
        """This cluster's key names, with the key that MACs its records
        (:class:`~proto.credentials.NotGrantedError` for a grant without it)."""
        return Keys(self.cluster, self.credentials.key(REGISTRY_RECORD))

    @property
    def keyring(self) -> Keyring:
        """The pool member's keys: the hash algorithm, the prefix-root key and the
        pool-block key. A process granted no pool-block key (the router: it never writes
        or reads a block) gets :data:`UNSHARED_KEY`, which no other process holds: any
        block it wrote would be refused as forged, any request key it named unused."""
        credentials = self.credentials
        try:
            block = credentials.key(POOL_BLOCK)
        except NotGrantedError:
            block = UNSHARED_KEY
        return Keyring(
            self.hash_algorithm,
            prefix_root=credentials.key(PREFIX_ROOT),
            pool_block=block,
        )

    @property
    def grpc_tls(self) -> bool:
        """Whether gRPC runs over TLS (any of the three TLS paths is set)."""
        return bool(self.grpc_tls_cert or self.grpc_tls_key or self.grpc_tls_ca)

    @property
    def redis_where(self) -> str:
        """``redis_url`` without any password in it, for log lines and errors."""
        parts = urlsplit(self.redis_url)
        if parts.password is None and "password=" not in parts.query:
            return self.redis_url
        host = parts.netloc.rsplit("@", 1)[-1]
        return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _url_has_credentials(url: str) -> bool:
    parts = urlsplit(url)
    return bool(parts.username or parts.password or "password=" in parts.query)


def _check_tls_files(cert: str, key: str, ca: str) -> None:
    if bool(cert) != bool(key):
        raise ValueError(
            "grpc_tls_cert and grpc_tls_key go together (this process's certificate and its "
            f"private key): got cert={cert!r}, key={key!r}"
        )
    for name, path in (("grpc_tls_cert", cert), ("grpc_tls_key", key), ("grpc_tls_ca", ca)):
        if not path:
            continue
        try:
            head = Path(path).read_bytes()[: 1 << 16]
        except OSError as exc:
            raise ValueError(f"{name}: cannot read {path!r} ({exc.strerror})") from None
        if b"-----BEGIN " not in head:
            raise ValueError(f"{name}: {path!r} is not a PEM file (no -----BEGIN line)")


class RegistryAccessError(RuntimeError):
    """Redis refused this process (credentials or ACL permissions); the message says which
    setting to change."""


def connect(
    cluster: ClusterConfig,
    socket_timeout: float | None = None,
    socket_connect_timeout: float | None = None,
    retry: bool = True,
) -> redis.Redis:
    """The one way to open the registry: a client for ``cluster.redis_url`` with the
    configured credentials. It connects lazily (the first command raises
    ``redis.RedisError``: wrap with :func:`explain` for a message that names the setting).
    ``retry=False``: a failed command fails at once (redis-py's default retries a refused
    connection for about 4 s), for callers on a hot path that must not wait."""
    options: dict[str, Any] = {} if retry else {"retry": Retry(NoBackoff(), 0)}
    credentials: dict[str, str] = {}
    if cluster.redis_username:
        credentials["username"] = cluster.redis_username
    if cluster.redis_password:
        credentials["password"] = cluster.redis_password
    if SentinelURL.matches(cluster.redis_url):
        target = SentinelURL.parse(cluster.redis_url)
        return sentinel_client(target, credentials, socket_timeout, socket_connect_timeout, options)
    return redis.Redis.from_url(
        cluster.redis_url,
        socket_timeout=socket_timeout,
        socket_connect_timeout=socket_connect_timeout,
        **credentials,
        **options,
    )


def explain(cluster: ClusterConfig, exc: BaseException) -> str:
    """A Redis failure as one actionable line (credentials and ACL problems name the
    settings to change; never the password)."""
    if isinstance(exc, RegistryAccessError):
        return str(exc)
    where = f"Redis at {cluster.redis_where}"
    user = cluster.redis_username or "default"
    if isinstance(exc, redis.AuthenticationError) or "NOAUTH" in str(exc):
        given = "no password" if not cluster.redis_password else f"user {user!r} and a password"
        return (
            f"{where} refused this process ({exc}; it sent {given}): set --redis-username and "
            f"the password (env KVSERVE_REDIS_USERNAME, KVSERVE_REDIS_PASSWORD) to a user "
            f"of that Redis"
        )
    if isinstance(exc, redis.exceptions.NoPermissionError):
        return (
            f"{where}: user {user!r} lacks a permission the registry needs ({exc}): grant it "
            f"+@read +@write +@keyspace +@connection +@scripting on keys '{cluster.cluster}:*'"
        )
    return f"{where}: {exc}"


def check(client: redis.Redis, cluster: ClusterConfig) -> None:
    """PING the registry now; raise :class:`RegistryAccessError` if Redis refuses this
    process (other failures propagate as ``redis.RedisError``/``OSError``)."""
    try:
        client.ping()
    except (redis.AuthenticationError, redis.exceptions.NoPermissionError) as exc:
        raise RegistryAccessError(explain(cluster, exc)) from exc

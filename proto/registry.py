"""The worker registry in Redis: the second contract between workers and the router.

Keys (``<cluster>`` is the cluster name, ``kvserve`` by default):

- ``<cluster>:worker:<worker id>``: a JSON :class:`WorkerRecord`, written by the worker on
  every heartbeat with a TTL of ``ttl_s``; a worker that stops heartbeating disappears;
- ``<cluster>:contract``: the cluster's KV contract (namespace and KV layout, which fix the
  pool's key space). The first worker sets it; a worker whose contract differs is refused
  (:class:`ContractMismatchError`). Heartbeats refresh its TTL, so it expires with the
  last worker and a restarted cluster may serve another model.

Only JSON goes through Redis (no pickle). Both sides import this module; neither imports
the other's package.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis

ROLES = ("prefill", "decode", "mixed")


@dataclass(frozen=True)
class ClusterConfig:
    """How a process finds its cluster and its peers (flags ``--redis-url`` etc., env
    ``KVSERVE_*``); workers, the router and the launcher share it, so every setting below
    has one definition and one spelling.

    Registry (Redis):

    - ``redis_url``: the registry (``redis://host:port/db``; ``rediss://`` for TLS);
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

    def __post_init__(self) -> None:
        if not self.redis_url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"redis_url must be a redis:// URL, got {self.redis_url!r}")
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

    @property
    def keys(self) -> Keys:
        return Keys(self.cluster)

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
) -> redis.Redis:
    """The one way to open the registry: a client for ``cluster.redis_url`` with the
    configured credentials. It connects lazily (the first command raises
    ``redis.RedisError``: wrap with :func:`explain` for a message that names the setting)."""
    credentials: dict[str, str] = {}
    if cluster.redis_username:
        credentials["username"] = cluster.redis_username
    if cluster.redis_password:
        credentials["password"] = cluster.redis_password
    return redis.Redis.from_url(
        cluster.redis_url,
        socket_timeout=socket_timeout,
        socket_connect_timeout=socket_connect_timeout,
        **credentials,
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
            f"+@read +@write +@keyspace +@connection on keys '{cluster.cluster}:*'"
        )
    return f"{where}: {exc}"


def check(client: redis.Redis, cluster: ClusterConfig) -> None:
    """PING the registry now; raise :class:`RegistryAccessError` if Redis refuses this
    process (other failures propagate as ``redis.RedisError``/``OSError``)."""
    try:
        client.ping()
    except (redis.AuthenticationError, redis.exceptions.NoPermissionError) as exc:
        raise RegistryAccessError(explain(cluster, exc)) from exc


class ContractMismatchError(RuntimeError):
    """A worker's KV contract differs from the one the cluster runs with."""


@dataclass(frozen=True)
class WorkerRecord:
    """What a worker tells the cluster about itself.

    ``model`` is the served model name; ``model_dir`` where the worker loaded it from (the
    router reads the tokenizer there unless told otherwise). ``contract`` is the KV
    contract text (namespace key and KV wire layout); ``hash_seed``
    and ``block_tokens`` let the router compute pool keys for lookups; ``load`` is the
    latest load report (the fields of ``LoadReport`` in ``worker.proto``).
    """

    worker_id: str
    address: str
    role: str
    model: str
    model_dir: str
    contract: str
    hash_seed: int
    block_tokens: int
    num_layers: int
    max_model_len: int
    started_at: float
    heartbeat_at: float
    load: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> WorkerRecord:
        data = json.loads(text)
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True)
class Keys:
    cluster: str = "kvserve"

    def worker(self, worker_id: str) -> str:
        return f"{self.cluster}:worker:{worker_id}"

    @property
    def workers_pattern(self) -> str:
        return f"{self.cluster}:worker:*"

    @property
    def contract(self) -> str:
        return f"{self.cluster}:contract"


def claim_contract(client: redis.Redis, keys: Keys, contract: str, ttl_s: float) -> None:
    """Set the cluster contract if none is set, refresh it if it is ours, else raise."""
    ttl_ms = max(1, int(ttl_s * 1000))
    client.set(keys.contract, contract, nx=True, px=ttl_ms)
    raw = client.get(keys.contract)
    current = raw.decode() if isinstance(raw, bytes) else raw
    if current is not None and current != contract:
        raise ContractMismatchError(
            f"this worker's KV contract differs from the cluster's "
            f"(cluster {keys.cluster!r} runs {current!r}; this worker has "
            f"{contract!r}): every worker must serve the same model, dtype, block size and "
            f"KV layout, or use another --cluster"
        )
    client.pexpire(keys.contract, ttl_ms)


def publish(client: redis.Redis, keys: Keys, record: WorkerRecord, ttl_s: float) -> None:
    """Write ``record`` under its TTL (one heartbeat), refreshing the contract's TTL too."""
    claim_contract(client, keys, record.contract, 3 * ttl_s)
    client.set(keys.worker(record.worker_id), record.to_json(), px=max(1, int(ttl_s * 1000)))


def withdraw(client: redis.Redis, keys: Keys, worker_id: str) -> None:
    """Remove a worker's record (clean shutdown)."""
    client.delete(keys.worker(worker_id))


def list_workers(client: redis.Redis, keys: Keys) -> list[WorkerRecord]:
    """Every live worker record (unparseable records are skipped)."""
    names = sorted(client.scan_iter(match=keys.workers_pattern, count=256))
    if not names:
        return []
    records: list[WorkerRecord] = []
    for raw in client.mget(names):
        if raw is None:
            continue
        try:
            records.append(WorkerRecord.from_json(raw))
        except (ValueError, TypeError):
            continue
    return records

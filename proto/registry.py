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
from typing import Any

import redis

ROLES = ("prefill", "decode", "mixed")


@dataclass(frozen=True)
class ClusterConfig:
    """How a process finds its cluster (flags ``--redis-url`` etc., env ``KVSERVE_*``).

    - ``redis_url``: the registry (``redis://[:password@]host:port/db``; ``rediss://`` for
      TLS);
    - ``cluster``: key prefix, so several clusters can share one Redis;
    - ``heartbeat_s``: how often a worker re-publishes its record and load;
    - ``heartbeat_ttl_s``: a record expires this long after its last heartbeat, so the
      router stops routing to a silent worker within this time.
    """

    redis_url: str = "redis://127.0.0.1:6379/0"
    cluster: str = "kvserve"
    heartbeat_s: float = 1.0
    heartbeat_ttl_s: float = 3.0

    def __post_init__(self) -> None:
        if not self.redis_url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"redis_url must be a redis:// URL, got {self.redis_url!r}")
        if not self.cluster or ":" in self.cluster:
            raise ValueError(f"cluster must be a non-empty name without ':', got {self.cluster!r}")
        if not 0 < self.heartbeat_s < self.heartbeat_ttl_s:
            raise ValueError("need 0 < heartbeat_s < heartbeat_ttl_s")

    @property
    def keys(self) -> Keys:
        return Keys(self.cluster)


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

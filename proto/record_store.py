"""Worker records and the contract in Redis, each with a MAC (the registry is
not believed blindly). :mod:`proto.registry` re-exports everything here.

Wire forms (JSON only; ``<name>`` is the Redis key a value is stored under; MACs are
:func:`proto.trust.mac` with :attr:`Keys.record_key`, as 64 hex digits):

- ``<cluster>:worker:<worker id>``: the fields of a :class:`WorkerRecord` plus ``"mac"``,
  the MAC of ``("worker-record", <name>, <canonical JSON of the fields>)``. The key name
  is inside the MAC, so a record cannot be replayed under another cluster or worker id;
- ``<cluster>:contract``: ``{"contract": <text>, "mac": <MAC of ("contract", <name>,
  <text>)>}``.

Reading a record (:func:`open_record`) checks, in this order: the size
(:data:`MAX_RECORD_BYTES`), the JSON, the MAC, the schema and bounds
(:class:`proto.records.WorkerRecord`) and that the record's worker id is the one its key
names; a failure raises :class:`RecordError` (``reason`` :data:`FORGED` or
:data:`MALFORMED`). :func:`read_workers` never raises for a bad value: it returns it as a
:class:`Rejection`. A MAC stops every lie about a record's content; it cannot stop a
writer of Redis from deleting a record or putting back an older one of the same key. The
age check of :func:`read_workers` (its ``max_age_s``: the router passes the liveness
window) bounds the second: a record put back is believed at most that long after the
heartbeat it carries.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import redis

from proto.records import (
    FORGED,
    MALFORMED,
    STALE,
    TEXT_BOUNDS,
    RecordError,
    WorkerRecord,
    canonical,
    check_text,
    malformed,
)
from proto.refusals import Rejection, RejectLog, show
from proto.trust import REGISTRY_RECORD, derive, mac, mac_ok

log = logging.getLogger(__name__)

MAX_RECORD_BYTES = 64 * 1024
"""A stored record or contract larger than this is refused unread (real ones: < 2 KiB)."""
_HEX_MAC = re.compile(r"[0-9a-f]{64}")
_RECORD_PURPOSE = b"worker-record"
_CONTRACT_PURPOSE = b"contract"
_NO_SECRET_KEY = derive("", REGISTRY_RECORD)


@dataclass(frozen=True)
class Keys:
    """One cluster's key names in Redis and the key of its records' MACs.

    ``record_key`` is ``derive(cluster_secret, REGISTRY_RECORD)``
    (:attr:`proto.registry.ClusterConfig.keys` sets it); the default is the key of an empty
    secret, which protects nothing (processes started by hand, tests)."""

    cluster: str = "kvserve"
    record_key: bytes = field(default=_NO_SECRET_KEY, repr=False)

    def worker(self, worker_id: str) -> str:
        return f"{self.cluster}:worker:{worker_id}"

    @property
    def workers_pattern(self) -> str:
        return f"{self.cluster}:worker:*"

    @property
    def contract(self) -> str:
        return f"{self.cluster}:contract"


class ContractMismatchError(RuntimeError):
    """A worker's KV contract differs from the one the cluster runs with."""


def _decode(raw: bytes | str, what: str) -> dict[str, Any]:
    """A stored value as a JSON object, bounded in size (nesting too, by the size)."""
    if len(raw) > MAX_RECORD_BYTES:
        raise RecordError(MALFORMED, f"{what} of {len(raw)} bytes (at most {MAX_RECORD_BYTES})")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise RecordError(MALFORMED, f"{what} is not JSON ({type(exc).__name__})") from None
    if not isinstance(data, dict):
        raise RecordError(MALFORMED, f"{what} is not a JSON object")
    return data


def _pop_tag(data: dict[str, Any], what: str) -> bytes:
    """The MAC that ``data`` carries, popped from it."""
    tag = data.pop("mac", None)
    if not isinstance(tag, str) or not _HEX_MAC.fullmatch(tag):
        raise RecordError(FORGED, f"{what} carries no MAC: not written with the cluster secret")
    return bytes.fromhex(tag)


def seal_fields(keys: Keys, name: str, fields: Mapping[str, object]) -> str:
    """The stored form of record ``fields`` under key ``name``: their canonical JSON with
    their MAC. (:func:`seal_record` is the way to write a record; this is the layer below,
    which tests use to MAC fields no :class:`WorkerRecord` would hold.)"""
    body = dict(fields)
    tag = mac(keys.record_key, _RECORD_PURPOSE, name.encode(), canonical(body).encode())
    return canonical({**body, "mac": tag.hex()})


def seal_record(keys: Keys, record: WorkerRecord) -> str:
    """What a worker stores under ``keys.worker(record.worker_id)``."""
    return seal_fields(keys, keys.worker(record.worker_id), dataclasses.asdict(record))


def open_record(keys: Keys, name: str, raw: bytes | str) -> WorkerRecord:
    """The record stored under key ``name``, once its size, JSON, MAC, schema and key all
    check (see the module docstring); else :class:`RecordError`."""
    data = _decode(raw, "record")
    tag = _pop_tag(data, "record")
    try:
        body = canonical(data).encode()
    except ValueError:  # NaN or infinity: never sealed, so never authentic
        raise RecordError(FORGED, "record holds NaN or infinity: not as sealed") from None
    if not mac_ok(keys.record_key, tag, _RECORD_PURPOSE, name.encode(), body):
        raise RecordError(FORGED, "record MAC does not verify: not written with this secret")
    record = WorkerRecord.from_fields(data)
    if keys.worker(record.worker_id) != name:
        raise malformed("worker_id", record.worker_id, f"differs from its key {show(name)}")
    return record


def seal_contract(keys: Keys, contract: str) -> str:
    """What the worker that sets or refreshes the cluster's contract stores."""
    check_text("contract", contract, TEXT_BOUNDS["contract"])
    tag = mac(keys.record_key, _CONTRACT_PURPOSE, keys.contract.encode(), contract.encode())
    return canonical({"contract": contract, "mac": tag.hex()})


def open_contract(keys: Keys, raw: bytes | str) -> str:
    """The text of a stored contract whose MAC verifies; else :class:`RecordError`."""
    data = _decode(raw, "contract")
    tag = _pop_tag(data, "contract")
    contract = data.get("contract")
    if not isinstance(contract, str) or set(data) != {"contract"}:
        raise RecordError(MALFORMED, "contract is not {contract, mac}")
    name = keys.contract.encode()
    if not mac_ok(keys.record_key, tag, _CONTRACT_PURPOSE, name, contract.encode()):
        raise RecordError(FORGED, "contract MAC does not verify: not written with this secret")
    return contract


def claim_contract(client: redis.Redis, keys: Keys, contract: str, ttl_s: float) -> None:
    """Set the cluster contract if none is set, refresh it if it is ours, else raise
    :class:`ContractMismatchError`. A stored contract whose MAC does not verify was not
    written by a holder of the cluster secret: it is not believed but replaced by ours
    (and logged), so that a writer of Redis without the secret cannot refuse every
    worker's heartbeat and so empty the cluster."""
    ttl_ms = max(1, int(ttl_s * 1000))
    sealed = seal_contract(keys, contract)
    client.set(keys.contract, sealed, nx=True, px=ttl_ms)
    raw = client.get(keys.contract)
    if raw is None:  # expired since the SET: the next beat sets it
        return
    try:
        current = open_contract(keys, raw)
    except RecordError as exc:
        log.warning("cluster %r: the contract in Redis is refused (%s); replaced by this "
                    "worker's", keys.cluster, exc)  # fmt: skip
        client.set(keys.contract, sealed, px=ttl_ms)
        return
    if current != contract:
        raise ContractMismatchError(
            f"this worker's KV contract differs from the cluster's "
            f"(cluster {keys.cluster!r} runs {current!r}; this worker has "
            f"{contract!r}): every worker must serve the same model, dtype, block size and "
            f"KV layout, or use another --cluster"
        )
    client.pexpire(keys.contract, ttl_ms)


def publish(client: redis.Redis, keys: Keys, record: WorkerRecord, ttl_s: float) -> None:
    """Write ``record`` with its MAC under its TTL (one heartbeat), refreshing the
    contract's TTL too."""
    claim_contract(client, keys, record.contract, 3 * ttl_s)
    sealed = seal_record(keys, record)
    client.set(keys.worker(record.worker_id), sealed, px=max(1, int(ttl_s * 1000)))


def withdraw(client: redis.Redis, keys: Keys, worker_id: str) -> None:
    """Remove a worker's record (clean shutdown)."""
    client.delete(keys.worker(worker_id))


@dataclass(frozen=True)
class Listing:
    """One read of the registry: the records that passed, and the values refused."""

    records: list[WorkerRecord]
    rejected: list[Rejection]


def read_workers(
    client: redis.Redis, keys: Keys, max_age_s: float | None = None, now: float | None = None
) -> Listing:
    """Every live worker record that :func:`open_record` accepts and, with ``max_age_s``,
    whose ``heartbeat_at`` is at most that many seconds before ``now`` (default
    ``time.time()``); every other value under the workers' key pattern comes back as a
    :class:`Rejection` (an authentic record too old: :data:`STALE`), never raised. Redis
    failures propagate.

    The age check stops a writer of Redis from putting back a record that a worker wrote
    long ago, without a TTL, to keep a departed worker's address in routing (the MAC proves
    who wrote a record, not when it was read). It compares clocks of two machines: their
    skew must stay well under ``max_age_s`` (NTP keeps it to milliseconds)."""
    listing = Listing([], [])
    now = time.time() if now is None else now
    names = sorted(client.scan_iter(match=keys.workers_pattern, count=256))
    if not names:
        return listing
    for name, raw in zip(names, client.mget(names), strict=True):
        if raw is None:  # expired since the SCAN
            continue
        key = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
        try:
            record = open_record(keys, key, raw)
        except RecordError as exc:
            listing.rejected.append(Rejection(key[:200], exc.reason, str(exc)))
            continue
        age = now - record.heartbeat_at
        if max_age_s is not None and age > max_age_s:
            why = (
                f"its heartbeat is {age:.1f} s old, past the {max_age_s:g} s liveness window "
                "(an old record put back, or this host's clock behind the worker's)"
            )
            listing.rejected.append(Rejection(key[:200], STALE, why))
            continue
        listing.records.append(record)
    return listing


_REJECTS = RejectLog(log, "registry value")


def list_workers(client: redis.Redis, keys: Keys) -> list[WorkerRecord]:
    """The records of :func:`read_workers`; the values refused are logged (rate-limited)."""
    listing = read_workers(client, keys)
    _REJECTS.note(listing.rejected)
    return listing.records

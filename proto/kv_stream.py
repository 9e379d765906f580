"""The wire form of KV event batches (:mod:`proto.kv_events`) and their Redis stream.

Wire form (transport independent: :func:`encode_batch` / :func:`decode_batch`): the MAC as
64 lowercase hex digits, then the body, compact JSON::

    {"v":1,"worker":"decode-0","incarnation":1.7e9,"seq":12,"snapshot":false,"part":0,
     "final":true,"events":[["<hash hex>","<parent hex>"],["<hash hex>"]]}

A two-element event is :class:`Stored` (hash, parent), a one-element one :class:`Removed`.
Hashes are lowercase hex of 1..64 digits (names are at most 256 bits). The MAC is
:func:`proto.trust.mac` with the registry-record key (:attr:`proto.record_store.Keys.
record_key`: workers and the router hold it, a monitor does not) over ``("kv-events",
<stream name>, <body bytes>)``: a batch cannot be forged without the key, nor replayed into
another cluster's stream. Like a registry record, any holder of the key may speak for any
worker id; a writer of Redis without it can only drop, repeat or reorder genuine batches,
which the index tolerates.

Decoding checks, in this order: size (:data:`MAX_BATCH_BYTES`), the MAC (before any JSON is
parsed), the JSON, then the schema (:meth:`EventBatch.__post_init__`). Any failure raises
:class:`BatchError` (a :class:`proto.records.RecordError`) with ``reason`` :data:`OVERSIZE`,
:data:`proto.records.FORGED` or :data:`proto.records.MALFORMED`; nothing else is touched.

Redis transport: one stream per cluster (:func:`stream_name`), one field per entry;
:func:`publish_batch` (XADD, approximately capped) and :func:`read_batches` (XREAD after an
entry id, bad entries returned as :class:`proto.refusals.Rejection`, never raised). A
reader that needs a worker's snapshot (it missed events, or it just started) sets that
worker's request key (:func:`request_snapshot`, expiring); the worker takes it
(:func:`take_snapshot_request`) and publishes one. The key carries nothing: anyone who may
write Redis can at most make a worker publish snapshots more often (it rate-limits them).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import redis

from proto.kv_events import MAX_EVENTS, BatchError, EventBatch, KVEvent, Removed, Stored
from proto.record_store import Keys
from proto.records import FORGED, MALFORMED
from proto.refusals import Rejection, show
from proto.trust import mac, mac_ok

VERSION = 1
MAX_BATCH_BYTES = 1 << 20
"""An encoded batch is at most this long (a full one of stored events: about 560 KiB)."""
OVERSIZE = "size"
""":attr:`BatchError.reason` of a value longer than :data:`MAX_BATCH_BYTES`."""
STREAM_FIELD = b"b"
"""The one field of a stream entry: the encoded batch."""
DEFAULT_MAXLEN = 10_000
"""Stream entries kept (approximately): about 10 s of steps of a 64-worker cluster."""

_PURPOSE = b"kv-events"
_MAC_HEX = re.compile(rb"[0-9a-f]{64}")
_HASH = re.compile(r"[0-9a-f]{1,64}")
_FIELDS = frozenset({"v", "worker", "incarnation", "seq", "snapshot", "part", "final", "events"})


def _bad(name: str, value: object, rule: str) -> BatchError:
    return BatchError(MALFORMED, f"{name}={show(value)}: {rule}")


def stream_name(keys: Keys) -> str:
    """The Redis stream of the cluster's KV events (``<cluster>:kv-events``)."""
    return f"{keys.cluster}:kv-events"


def _tag(keys: Keys, body: bytes) -> bytes:
    return mac(keys.record_key, _PURPOSE, stream_name(keys).encode(), body)


def seal_body(keys: Keys, body: bytes) -> bytes:
    """The wire form of ``body`` (MAC then body) without checking it: the layer under
    :func:`encode_batch`, for tests that need a genuine MAC on a malformed body."""
    return _tag(keys, body).hex().encode() + body


def encode_batch(keys: Keys, batch: EventBatch) -> bytes:
    """The wire form of ``batch`` (module docstring), MAC'd with ``keys.record_key``.
    ``batch`` was validated when made, so it always decodes back to itself."""
    body = {
        "v": VERSION,
        "worker": batch.worker_id,
        "incarnation": batch.incarnation,
        "seq": batch.seq,
        "snapshot": batch.snapshot,
        "part": batch.part,
        "final": batch.final,
        "events": [[format(h, "x") for h in event] for event in batch.events],
    }
    return seal_body(keys, json.dumps(body, separators=(",", ":")).encode())


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def decode_batch(keys: Keys, raw: bytes | str) -> EventBatch:
    """The batch whose wire form is ``raw``, once its size, MAC, JSON and schema check
    (module docstring); else :class:`BatchError`."""
    if len(raw) > MAX_BATCH_BYTES:
        raise BatchError(OVERSIZE, f"batch of {len(raw)} bytes (at most {MAX_BATCH_BYTES})")
    try:
        data = raw.encode() if isinstance(raw, str) else bytes(raw)
    except UnicodeEncodeError:
        raise BatchError(FORGED, "batch is not ASCII: not as sealed") from None
    if len(data) > MAX_BATCH_BYTES:
        raise BatchError(OVERSIZE, f"batch of {len(data)} bytes (at most {MAX_BATCH_BYTES})")
    tag, body = data[:64], data[64:]
    if not _MAC_HEX.fullmatch(tag):
        raise BatchError(FORGED, "batch carries no MAC: not written with the cluster secret")
    if not mac_ok(keys.record_key, bytes.fromhex(tag.decode()), _PURPOSE,
                  stream_name(keys).encode(), body):  # fmt: skip
        raise BatchError(FORGED, "batch MAC does not verify: not written with this secret")
    try:
        fields = json.loads(body, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise BatchError(MALFORMED, f"batch is not JSON ({type(exc).__name__})") from None
    return _from_fields(fields)


def _from_fields(fields: object) -> EventBatch:
    if not isinstance(fields, dict) or set(fields) != _FIELDS:
        keys = sorted(fields) if isinstance(fields, dict) else fields
        raise _bad("batch", keys, f"must be an object of exactly {sorted(_FIELDS)}")
    if fields["v"] != VERSION or type(fields["v"]) is not int:
        raise _bad("v", fields["v"], f"this build reads version {VERSION}")
    raw_events = fields["events"]
    if not isinstance(raw_events, list) or len(raw_events) > MAX_EVENTS:
        raise _bad("events", show(raw_events), f"must be a list of at most {MAX_EVENTS}")
    events: list[KVEvent] = []
    for raw in raw_events:
        if (
            not isinstance(raw, list)
            or not 1 <= len(raw) <= 2
            or not all(isinstance(h, str) and _HASH.fullmatch(h) for h in raw)
        ):
            raise _bad("event", raw, "[hash hex, parent hex] or [hash hex], 1..64 digits")
        names = [int(h, 16) for h in raw]
        events.append(Stored(names[0], names[1]) if len(names) == 2 else Removed(names[0]))
    return EventBatch(
        worker_id=fields["worker"],
        incarnation=fields["incarnation"],
        seq=fields["seq"],
        events=tuple(events),
        snapshot=fields["snapshot"],
        part=fields["part"],
        final=fields["final"],
    )


def publish_batch(
    client: redis.Redis, keys: Keys, batch: EventBatch, maxlen: int = DEFAULT_MAXLEN
) -> bytes:
    """XADD ``batch`` to the cluster's stream, trimming it to about ``maxlen`` entries;
    returns the entry id. Redis failures propagate; the failed batch keeps its seq (the
    next one gets the following seq), so readers see the gap, and the worker's next
    publication should be a snapshot."""
    entry: dict[Any, Any] = {STREAM_FIELD: encode_batch(keys, batch)}
    entry_id = client.xadd(stream_name(keys), entry, maxlen=maxlen, approximate=True)
    return entry_id if isinstance(entry_id, bytes) else str(entry_id).encode()


@dataclass(frozen=True)
class Reading:
    """One XREAD: the batches that decoded (with their entry ids, in stream order), the
    entries refused, and ``last_id``, the id to read after next time (past refused ones)."""

    batches: list[tuple[bytes, EventBatch]]
    rejected: list[Rejection]
    last_id: bytes


def read_batches(
    client: redis.Redis,
    keys: Keys,
    after: bytes = b"0-0",
    count: int = 1024,
    block_ms: int | None = None,
) -> Reading:
    """Up to ``count`` entries of the stream after entry id ``after`` (``b"0-0"``: from the
    oldest kept; ``b"$"``: only new ones, with ``block_ms``), waiting at most ``block_ms``
    (None: not at all). Bad entries become :class:`Rejection`\\ s; Redis failures
    propagate."""
    name = stream_name(keys)
    reply: Any = client.xread({name: after}, count=count, block=block_ms)
    batches: list[tuple[bytes, EventBatch]] = []
    rejected: list[Rejection] = []
    last = after
    for _stream, entries in reply or []:  # RESP2: [[name, [(id, {field: value}), ...]]]
        for entry_id, values in entries:
            last = entry_id if isinstance(entry_id, bytes) else str(entry_id).encode()
            try:
                raw = (values or {}).get(STREAM_FIELD)
                if raw is None:
                    raise BatchError(MALFORMED, f"entry has no field {STREAM_FIELD!r}")
                batches.append((last, decode_batch(keys, raw)))
            except BatchError as exc:
                rejected.append(Rejection(f"{name}/{last.decode()}", exc.reason, str(exc)))
    return Reading(batches, rejected, last)


def snapshot_request_key(keys: Keys, worker_id: str) -> str:
    """The key a reader sets to ask ``worker_id`` for a snapshot."""
    return f"{keys.cluster}:kv-events:want:{worker_id}"


def request_snapshot(client: redis.Redis, keys: Keys, worker_id: str, ttl_s: float) -> None:
    """Ask ``worker_id`` for a snapshot (the request lapses after ``ttl_s``: a worker that
    is gone leaves no key behind). Redis failures propagate."""
    client.set(snapshot_request_key(keys, worker_id), b"1", px=max(1, int(ttl_s * 1000)))


def take_snapshot_request(client: redis.Redis, keys: Keys, worker_id: str) -> bool:
    """Whether a reader asked ``worker_id`` for a snapshot; the request is consumed (one
    DEL: two workers of one id would share it). Redis failures propagate."""
    return bool(client.delete(snapshot_request_key(keys, worker_id)))

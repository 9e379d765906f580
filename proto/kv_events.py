"""KV events (issue 19): what a worker tells the router about its local prefix cache.

A worker publishes, once per engine step that changed its prefix cache, one
:class:`EventBatch`: the blocks it indexed (:class:`Stored`: the block's chained name and
its parent's, :mod:`kvpool.hashing`) and the blocks it evicted (:class:`Removed`), in the
order they happened. The router applies them to its per-worker index
(:mod:`router.prefix_index`) to place a request where its prompt is cached.

Ordering and loss. Each worker process (an *incarnation*, named by its record's
``started_at``) numbers its batches ``seq = 0, 1, 2, ...``; a new process starts again at 0
with an empty cache. A reader that sees a seq jump has missed events and must wait for a
*snapshot*: a run of batches with consecutive seqs and ``snapshot=True``, parts ``0, 1,
...``, the last one ``final``, whose :class:`Stored` events together list every block the
worker holds (one snapshot may exceed :data:`MAX_EVENTS`, hence parts). A delta batch is
``part=0, final=True``.

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
entry id, bad entries returned as :class:`proto.refusals.Rejection`, never raised).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, NamedTuple

import redis

from proto.record_store import Keys
from proto.records import FORGED, MALFORMED, MAX_TIMESTAMP, RecordError
from proto.refusals import Rejection, show
from proto.trust import mac, mac_ok

VERSION = 1
MAX_EVENTS = 4096
"""Events per batch (a delta is usually a handful; a snapshot is split into parts)."""
MAX_BATCH_BYTES = 1 << 20
"""An encoded batch is at most this long (a full one of stored events: about 560 KiB)."""
MAX_SEQ = (1 << 63) - 1
MAX_PARTS = 1 << 16
"""Parts of one snapshot (with :data:`MAX_EVENTS` each: 268M blocks)."""
HASH_LIMIT = 1 << 256
"""Block names and roots are below this (:data:`kvpool.hashing.HASH_BITS` is 256 at most)."""
WORKER_ID = re.compile(r"[!-.0-9;-~]{1,128}")
"""The worker id rule of :class:`proto.records.WorkerRecord` (a test pins the equality)."""
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


class BatchError(RecordError):
    """An event batch is refused; ``reason`` is :data:`OVERSIZE`, ``FORGED`` or
    ``MALFORMED``, the message says what and why."""


class Stored(NamedTuple):
    """The worker indexed block ``hash`` (whose parent in the chain is ``parent``)."""

    hash: int
    parent: int


class Removed(NamedTuple):
    """The worker evicted block ``hash`` from its prefix cache."""

    hash: int


KVEvent = Stored | Removed


def _bad(name: str, value: object, rule: str) -> BatchError:
    return BatchError(MALFORMED, f"{name}={show(value)}: {rule}")


def _is_int(value: object, low: int, high: int) -> bool:
    return type(value) is int and low <= value <= high


@dataclass(frozen=True)
class EventBatch:
    """One batch of one worker's cache events; constructing one validates it
    (:class:`BatchError`, ``MALFORMED``).

    ``worker_id`` follows :data:`WORKER_ID`; ``incarnation`` is the worker process's
    ``started_at`` (a Unix time in ``0..MAX_TIMESTAMP``; a later one is a newer process);
    ``seq`` in ``0..MAX_SEQ`` counts this incarnation's batches; ``events`` (at most
    :data:`MAX_EVENTS`) in the order they happened; ``snapshot``: part ``part`` of a
    snapshot (only :class:`Stored` events), ``final`` on its last part; a delta has
    ``part=0, final=True``."""

    worker_id: str
    incarnation: float
    seq: int
    events: tuple[KVEvent, ...] = ()
    snapshot: bool = False
    part: int = 0
    final: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.worker_id, str) or not WORKER_ID.fullmatch(self.worker_id):
            raise _bad("worker", self.worker_id, "1..128 printable ASCII, no space, ':', '/'")
        inc = self.incarnation
        if type(inc) not in (int, float) or not 0 <= inc <= MAX_TIMESTAMP:
            raise _bad("incarnation", inc, f"must be a Unix time in 0..{MAX_TIMESTAMP:g}")
        if not _is_int(self.seq, 0, MAX_SEQ):
            raise _bad("seq", self.seq, f"must be an integer in 0..{MAX_SEQ}")
        if type(self.snapshot) is not bool or type(self.final) is not bool:
            raise _bad("snapshot/final", (self.snapshot, self.final), "must be booleans")
        if not _is_int(self.part, 0, MAX_PARTS - 1 if self.snapshot else 0):
            raise _bad("part", self.part, "0 for a delta, else 0..MAX_PARTS-1")
        if not self.snapshot and not self.final:
            raise _bad("final", self.final, "a delta is final")
        if not isinstance(self.events, tuple) or len(self.events) > MAX_EVENTS:
            raise _bad("events", len(self.events), f"must be a tuple of <= {MAX_EVENTS}")
        for event in self.events:
            if not isinstance(event, (Stored, Removed)) or not all(
                _is_int(h, 0, HASH_LIMIT - 1) for h in event
            ):
                raise _bad("event", event, "a Stored or Removed of names in 0..2^256-1")
            if self.snapshot and not isinstance(event, Stored):
                raise _bad("event", event, "a snapshot lists only Stored blocks")


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

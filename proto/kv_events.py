"""KV events: what a worker tells the router about its local prefix cache.

A worker publishes, once per engine step that changed its prefix cache, one
:class:`EventBatch`: the blocks it indexed (:class:`Stored`: the block's chained name and
its parent's, :mod:`kvpool.hashing`) and the blocks it evicted (:class:`Removed`), in the
order they happened. The router applies them to its per-worker index
(:mod:`router.placement.prefix_index`) to place a request where its prompt is cached.

Ordering and loss. Each worker process (an *incarnation*, named by its record's
``started_at``) numbers its batches ``seq = 0, 1, 2, ...``; a new process starts again at 0
with an empty cache. A reader that sees a seq jump has missed events and must wait for a
*snapshot*: a run of batches with consecutive seqs and ``snapshot=True``, parts ``0, 1,
...``, the last one ``final``, whose :class:`Stored` events together list every block the
worker holds (one snapshot may exceed :data:`MAX_EVENTS`, hence parts). A delta batch is
``part=0, final=True``.

The wire form and the Redis transport are :mod:`proto.kv_stream`. Pure: no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

from proto.records import MALFORMED, MAX_TIMESTAMP, RecordError
from proto.refusals import show

MAX_EVENTS = 4096
"""Events per batch (a delta is usually a handful; a snapshot is split into parts)."""
MAX_SEQ = (1 << 63) - 1
MAX_PARTS = 1 << 16
"""Parts of one snapshot (with :data:`MAX_EVENTS` each: 268M blocks)."""
HASH_LIMIT = 1 << 256
"""Block names and roots are below this (:data:`kvpool.hashing.HASH_BITS` is 256 at most)."""
WORKER_ID = re.compile(r"[!-.0-9;-~]{1,128}")
"""The worker id rule of :class:`proto.records.WorkerRecord` (a test pins the equality)."""


class BatchError(RecordError):
    """An event batch is refused; ``reason`` is :data:`proto.kv_stream.OVERSIZE`, ``FORGED``
    or ``MALFORMED``, the message says what and why."""


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

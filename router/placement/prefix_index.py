"""The router's view of each worker's local prefix cache, built from KV events.

Pure bookkeeping, no I/O: the caller reads :class:`proto.kv_events.EventBatch`\\ es (from
Redis, :func:`proto.kv_events.read_batches`) and hands each to :meth:`PrefixIndex.apply`;
placement asks :meth:`PrefixIndex.matched_all` how many leading blocks of a prompt's chain
(computed once, with the request's salted root) each worker holds. No radix tree is needed:
a block name is a chained hash, so "holds the first ``k`` blocks" is "holds the first ``k``
names".

Per worker the index keeps its incarnation (``started_at``), the highest seq seen of it, the
set of block names it holds, and whether that set is *synced* (known to mirror the worker's
cache as of that seq). Applying a batch (:class:`Outcome` says what happened):

- a later incarnation than the one known (or an unknown worker) starts afresh: no blocks,
  synced, as of seq ``-1`` (a process starts with an empty cache and seq 0); an earlier
  incarnation is :attr:`Outcome.STALE`;
- a seq at or below the highest seen (a duplicate, or an old batch reordered) is
  :attr:`Outcome.STALE` and changes nothing;
- any other seq jump means events were missed: the worker's blocks are dropped and it is
  unsynced: it answers 0 until a snapshot completes (:meth:`wanting_snapshot` names such
  workers). A delta right after the highest seq seen is applied, event by event in order,
  if the worker is synced (:attr:`Outcome.APPLIED`), else :attr:`Outcome.IGNORED`; one
  after a jump is :attr:`Outcome.GAP`;
- snapshot part 0 starts collecting a new set (after a jump too); each next part
  (consecutive seq and part) adds to it; the final part replaces the worker's set and makes
  it synced (:attr:`Outcome.SNAPSHOT`). A part whose predecessors were missed abandons the
  collection. While a snapshot is collected without a jump, a synced worker keeps
  answering from its current set (a snapshot changes nothing in the worker's cache).

Answers are lookups only: ``matched_all`` passes over the chain once against one map from
a name to the bitmask of the synced workers that hold it, whatever the number of workers.
Not thread-safe: one owner (the router's event loop) applies and asks.
"""

from __future__ import annotations

import bisect
import enum
import itertools
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field

from proto.kv_events import EventBatch, Stored


class Outcome(enum.Enum):
    """What :meth:`PrefixIndex.apply` did with a batch."""

    APPLIED = "applied"  # a delta applied, or a snapshot part collected
    STALE = "stale"  # an old incarnation, a duplicate or a reordered old batch: ignored
    GAP = "gap"  # events were missed: the worker answers 0 until a snapshot
    SNAPSHOT = "snapshot"  # a snapshot completed: the worker's set replaced, synced
    IGNORED = "ignored"  # unusable but harmless: a delta while unsynced, a stray part


@dataclass
class _Worker:
    incarnation: float
    bit: int
    last_seq: int = -1
    synced: bool = True
    blocks: set[int] = field(default_factory=set)
    pending: set[int] | None = None
    pending_part: int = 0


@dataclass(frozen=True)
class IndexStats:
    """Counters since the index was made, and its size now."""

    blocks: dict[str, int]
    unsynced: list[str]
    batches: int
    stale: int
    gaps: int
    snapshots: int
    restarts: int


class PrefixIndex:
    """Block names held by each worker (module docstring). Lifecycle: made empty; a worker
    appears with its first batch, is replaced by a later incarnation, and leaves with
    :meth:`forget` (the caller calls it when the worker leaves the registry)."""

    def __init__(self) -> None:
        self._workers: dict[str, _Worker] = {}
        self._holders: dict[int, int] = {}  # block name -> bitmask of synced holders
        self._ids: dict[int, str] = {}  # bit -> worker id
        self._free_bits: list[int] = []
        self._synced_mask = 0
        self._counts = dict.fromkeys(("batches", "stale", "gaps", "snapshots", "restarts"), 0)

    # --- applying batches -------------------------------------------------------------

    def apply(self, batch: EventBatch) -> Outcome:
        """Apply one batch (module docstring). Never raises for a valid batch."""
        self._counts["batches"] += 1
        worker = self._workers.get(batch.worker_id)
        if worker is not None and batch.incarnation < worker.incarnation:
            return self._count(Outcome.STALE)
        if worker is None:
            bit = self._free_bits.pop() if self._free_bits else len(self._ids)
            worker = self._fresh(batch.worker_id, batch.incarnation, bit)
        elif batch.incarnation > worker.incarnation:
            self._counts["restarts"] += 1
            self._drop(worker)
            worker = self._fresh(batch.worker_id, batch.incarnation, worker.bit)
        if batch.seq <= worker.last_seq:
            return self._count(Outcome.STALE)
        contiguous = batch.seq == worker.last_seq + 1
        worker.last_seq = batch.seq
        if not contiguous:
            self._counts["gaps"] += 1
            self._desync(worker)
        if batch.snapshot:
            return self._snapshot_part(worker, batch, contiguous)
        worker.pending = None
        if not contiguous:
            return Outcome.GAP
        if not worker.synced:
            return Outcome.IGNORED
        for event in batch.events:
            if isinstance(event, Stored):
                self._hold(worker, event.hash)
            else:
                self._release(worker, event.hash)
        return Outcome.APPLIED

    def _snapshot_part(self, worker: _Worker, batch: EventBatch, contiguous: bool) -> Outcome:
        hashes = (event.hash for event in batch.events)
        if batch.part == 0:
            worker.pending = set(hashes)
        elif worker.pending is not None and batch.part == worker.pending_part + 1:
            worker.pending.update(hashes)
        else:  # earlier parts were missed (a gap), or out of protocol (the set stands)
            worker.pending = None
            return Outcome.IGNORED if contiguous else Outcome.GAP
        worker.pending_part = batch.part
        if not batch.final:
            return Outcome.APPLIED
        new, worker.pending = worker.pending, None
        for h in worker.blocks - new:
            self._release(worker, h)
        for h in new - worker.blocks:
            self._hold(worker, h)
        if not worker.synced:
            worker.synced = True
            self._synced_mask |= 1 << worker.bit
        return self._count(Outcome.SNAPSHOT)

    def forget(self, worker_id: str) -> None:
        """Drop everything known of ``worker_id`` (it left the registry); unknown: no-op. A
        batch of it that arrives later makes it known again as a worker never seen (so the
        caller applies only batches of workers in the registry)."""
        worker = self._workers.pop(worker_id, None)
        if worker is not None:
            self._drop(worker)
            self._synced_mask &= ~(1 << worker.bit)
            del self._ids[worker.bit]
            self._free_bits.append(worker.bit)

    # --- questions --------------------------------------------------------------------

    def matched(self, worker_id: str, hashes: Sequence[int]) -> int:
        """How many leading names of ``hashes`` (one prompt's chain) ``worker_id`` holds;
        0 for an unknown or unsynced worker."""
        worker = self._workers.get(worker_id)
        if worker is None or not worker.synced:
            return 0
        held = list(map(worker.blocks.__contains__, hashes))  # one C-level pass
        return held.index(False) if False in held else len(held)

    def matched_all(self, hashes: Sequence[int]) -> dict[str, int]:
        """:meth:`matched` for every known worker, in one pass over ``hashes``: the running
        AND of the holder masks (C-level ``map`` and ``accumulate``) says, at each
        position, which workers hold the whole chain up to there; each worker's count is a
        binary search over it (its bit is set on a leading run only)."""
        result = dict.fromkeys(self._workers, 0)
        alive = self._synced_mask
        if not alive or not hashes:
            return result
        masks = map(self._holders.get, hashes, itertools.repeat(0))
        running = list(itertools.accumulate(masks, operator.and_, initial=alive))
        bits = alive
        while bits:
            low = bits & -bits
            bits ^= low
            count = bisect.bisect_left(running, True, key=lambda m: not m & low) - 1
            result[self._ids[low.bit_length() - 1]] = count
        return result

    def synced(self, worker_id: str) -> bool:
        """Whether the index knows ``worker_id``'s cache (False for an unknown worker)."""
        worker = self._workers.get(worker_id)
        return worker is not None and worker.synced

    def wanting_snapshot(self) -> list[str]:
        """The workers that missed events and answer 0 until they publish a snapshot."""
        return sorted(w for w, state in self._workers.items() if not state.synced)

    def position(self, worker_id: str) -> tuple[float, int] | None:
        """``(incarnation, highest seq seen)`` of ``worker_id``, None if unknown."""
        worker = self._workers.get(worker_id)
        return None if worker is None else (worker.incarnation, worker.last_seq)

    def blocks(self, worker_id: str) -> frozenset[int]:
        """A copy of the names held by ``worker_id`` (empty when unsynced; tests, debug)."""
        worker = self._workers.get(worker_id)
        return frozenset(worker.blocks) if worker is not None else frozenset()

    def stats(self) -> IndexStats:
        """Blocks per worker, unsynced workers and the counters."""
        return IndexStats(
            blocks={w: len(state.blocks) for w, state in self._workers.items()},
            unsynced=self.wanting_snapshot(),
            **self._counts,
        )

    # --- internals --------------------------------------------------------------------

    def _count(self, outcome: Outcome) -> Outcome:
        self._counts["stale" if outcome is Outcome.STALE else "snapshots"] += 1
        return outcome

    def _fresh(self, worker_id: str, incarnation: float, bit: int) -> _Worker:
        """A new incarnation's state (no blocks, synced as of seq -1) on ``bit``."""
        worker = _Worker(incarnation, bit)
        self._workers[worker_id] = worker
        self._ids[bit] = worker_id
        self._synced_mask |= 1 << bit
        return worker

    def _hold(self, worker: _Worker, h: int) -> None:
        if h not in worker.blocks:
            worker.blocks.add(h)
            self._holders[h] = self._holders.get(h, 0) | (1 << worker.bit)

    def _release(self, worker: _Worker, h: int) -> None:
        if h in worker.blocks:
            worker.blocks.discard(h)
            mask = self._holders[h] & ~(1 << worker.bit)
            if mask:
                self._holders[h] = mask
            else:
                del self._holders[h]

    def _drop(self, worker: _Worker) -> None:
        """Release every block of ``worker`` (its bit stays assigned)."""
        for h in list(worker.blocks):
            self._release(worker, h)
        worker.pending = None

    def _desync(self, worker: _Worker) -> None:
        self._drop(worker)
        worker.synced = False
        self._synced_mask &= ~(1 << worker.bit)

"""The router's prefix index (issue 19) against a model of the workers' caches.

:class:`SimWorker` is a worker as the index must see it: a cache of block names, batches
numbered per incarnation, snapshots in parts, restarts with an empty cache; every batch it
emits is recorded with the cache it leaves behind (``truth``). The properties:

- safety, under any delivery (batches dropped, duplicated, reordered): after every batch
  the index knows each worker's latest incarnation delivered, and a worker it calls synced
  holds exactly what the model held at the batch it last saw; any other answers 0;
  ``matched`` and ``matched_all`` count leading names of that set;
- liveness: delivered in order (duplicates and replays of old batches allowed), the index
  ends equal to every cache without a gap; after any chaos, one snapshot delivered in order
  makes a worker synced and equal again.
"""

from __future__ import annotations

from collections.abc import Iterable

from hypothesis import given, settings
from hypothesis import strategies as st

from proto.kv_events import EventBatch, KVEvent, Removed, Stored
from router.placement.prefix_index import Outcome, PrefixIndex

IDS = ("w0", "w1", "w2")
UNIVERSE = range(1, 13)
PART = 3  # snapshot events per part: most snapshots have several parts

Truth = dict[tuple[str, float, int], frozenset[int]]


class SimWorker:
    """One worker's cache and the batches it publishes (into ``wire``)."""

    def __init__(self, worker_id: str, wire: list[EventBatch], truth: Truth) -> None:
        self.worker_id, self.wire, self.truth = worker_id, wire, truth
        self.incarnation, self.seq = 1.0, 0
        self.cache: set[int] = set()
        self.unsent: list[KVEvent] = []

    def store(self, h: int) -> None:
        if h not in self.cache:
            self.cache.add(h)
            self.unsent.append(Stored(h, h - 1))

    def remove(self, h: int) -> None:
        if h in self.cache:
            self.cache.discard(h)
            self.unsent.append(Removed(h))

    def flush(self) -> None:
        if self.unsent:
            self._emit(tuple(self.unsent))
            self.unsent = []

    def snapshot(self) -> None:
        self.flush()
        names = sorted(self.cache)
        parts = [names[i : i + PART] for i in range(0, len(names), PART)] or [[]]
        for i, part in enumerate(parts):
            events = tuple(Stored(h, 0) for h in part)
            self._emit(events, snapshot=True, part=i, final=i == len(parts) - 1)

    def restart(self) -> None:
        """A new process: unsent events die with the old one."""
        self.incarnation += 1.0
        self.seq, self.cache, self.unsent = 0, set(), []

    def _emit(self, events: tuple[KVEvent, ...], **kind: object) -> None:
        batch = EventBatch(self.worker_id, self.incarnation, self.seq, events, **kind)  # type: ignore[arg-type]
        self.wire.append(batch)
        self.truth[(self.worker_id, self.incarnation, self.seq)] = frozenset(self.cache)
        self.seq += 1


Op = tuple[int, str, list[tuple[bool, int]]]
OPS = st.lists(
    st.tuples(
        st.integers(0, len(IDS) - 1),
        st.sampled_from(["step"] * 6 + ["edit", "snapshot", "restart"]),
        st.lists(st.tuples(st.booleans(), st.sampled_from(UNIVERSE)), max_size=4),
    ),
    min_size=12,
    max_size=50,
)
"""Per op, one worker: a ``step`` stores (True) or removes names then publishes them, an
``edit`` only changes its cache (published with its next step, or lost by a restart)."""
CHAINS = st.lists(st.lists(st.sampled_from(UNIVERSE), max_size=8, unique=True), max_size=3)


def run(workers: dict[str, SimWorker], ops: Iterable[Op]) -> None:
    for i, kind, changes in ops:
        worker = workers[IDS[i]]
        for store, h in changes if kind in ("step", "edit") else ():
            if store:
                worker.store(h)
            else:
                worker.remove(h)
        if kind == "step":
            worker.flush()
        elif kind in ("snapshot", "restart"):
            getattr(worker, kind)()


def fleet() -> tuple[dict[str, SimWorker], list[EventBatch], Truth]:
    wire: list[EventBatch] = []
    truth: Truth = {}
    return {w: SimWorker(w, wire, truth) for w in IDS}, wire, truth


def leading(chain: list[int], held: Iterable[int]) -> int:
    held = set(held)
    return next((i for i, h in enumerate(chain) if h not in held), len(chain))


def check_safe(
    index: PrefixIndex, newest: dict[str, float], truth: Truth, chains: list[list[int]]
) -> None:
    """Every claim of the index holds of the model (module docstring)."""
    for worker_id, incarnation in newest.items():
        position = index.position(worker_id)
        assert position is not None and position[0] == incarnation
        if index.synced(worker_id):
            assert index.blocks(worker_id) == truth[(worker_id, *position)]
        else:
            assert index.blocks(worker_id) == frozenset()
            assert worker_id in index.wanting_snapshot()
    assert set(index.stats().blocks) == set(newest)
    for chain in chains:
        answers = index.matched_all(chain)
        assert answers == {w: index.matched(w, chain) for w in newest}
        for worker_id, count in answers.items():
            assert count == leading(chain, index.blocks(worker_id))


@settings(max_examples=300, deadline=None)
@given(ops=OPS, data=st.data(), chains=CHAINS)
def test_any_delivery_leaves_the_index_true_or_silent(
    ops: list[Op], data: st.DataObject, chains: list[list[int]]
) -> None:
    workers, wire, truth = fleet()
    run(workers, ops)
    plan = data.draw(
        st.lists(st.tuples(st.sampled_from(["send", "send", "drop", "twice"]), st.integers(0, 4),
                           st.integers(0, 6)), min_size=len(wire), max_size=len(wire))
    )  # fmt: skip
    arrivals = []
    for i, (batch, (fate, delay, again)) in enumerate(zip(wire, plan, strict=True)):
        if fate != "drop":
            arrivals.append((i + delay, batch))
        if fate == "twice":
            arrivals.append((i + delay + again, batch))
    arrivals.sort(key=lambda arrival: arrival[0])
    index = PrefixIndex()
    newest: dict[str, float] = {}
    for _, batch in arrivals:
        index.apply(batch)
        newest[batch.worker_id] = max(newest.get(batch.worker_id, 0.0), batch.incarnation)
        check_safe(index, newest, truth, chains)
    # then every worker publishes a snapshot (and goes on), delivered in order: all synced
    after = len(wire)
    for worker in workers.values():
        worker.snapshot()
    run(workers, data.draw(OPS))
    for worker in workers.values():
        worker.flush()
    for batch in wire[after:]:
        index.apply(batch)
    assert index.wanting_snapshot() == []
    for worker in workers.values():
        settled(index, worker)


def settled(index: PrefixIndex, worker: SimWorker) -> None:
    """The index knows ``worker``'s cache now (all its batches delivered in order), or the
    worker restarted and its new process has said nothing yet."""
    position = index.position(worker.worker_id)
    if worker.seq == 0:
        assert position is None or position[0] < worker.incarnation
        return
    assert position == (worker.incarnation, worker.seq - 1)
    assert index.synced(worker.worker_id)
    assert index.blocks(worker.worker_id) == worker.cache
    assert index.stats().blocks[worker.worker_id] == len(worker.cache)


@settings(max_examples=200, deadline=None)
@given(ops=OPS, replays=st.lists(st.tuples(st.integers(0, 200), st.integers(0, 200))))
def test_in_order_delivery_with_replays_never_needs_a_snapshot(
    ops: list[Op], replays: list[tuple[int, int]]
) -> None:
    workers, wire, _ = fleet()
    run(workers, ops)
    for worker in workers.values():
        worker.flush()
    arrivals = list(wire)
    for at, which in replays:  # an old batch again, anywhere after its first delivery
        if wire:
            original = wire[which % len(wire)]
            first = arrivals.index(original)
            arrivals.insert(first + 1 + at % (len(arrivals) - first), original)
    index = PrefixIndex()
    outcomes = [index.apply(batch) for batch in arrivals]
    assert Outcome.GAP not in outcomes and Outcome.IGNORED not in outcomes
    assert outcomes.count(Outcome.STALE) == len(arrivals) - len(wire)
    stats = index.stats()
    assert stats.gaps == 0 and stats.unsynced == [] and stats.batches == len(arrivals)
    for worker in workers.values():
        settled(index, worker)


def delta(seq: int, *events: KVEvent, worker: str = "w0", incarnation: float = 1.0) -> EventBatch:
    return EventBatch(worker, incarnation, seq, events)


def snap(seq: int, part: int, final: bool, *names: int, worker: str = "w0") -> EventBatch:
    events = tuple(Stored(h, 0) for h in names)
    return EventBatch(worker, 1.0, seq, events, snapshot=True, part=part, final=final)


def test_a_snapshot_replaces_what_the_index_knew() -> None:
    """A synced worker that resyncs (its snapshot differs: events it could not publish)."""
    index = PrefixIndex()
    assert index.apply(delta(0, Stored(1, 0), Stored(2, 1), Stored(3, 2))) is Outcome.APPLIED
    assert index.apply(snap(1, 0, False, 1, 4)) is Outcome.APPLIED
    assert index.matched("w0", [1, 2, 3]) == 3  # still answers while the parts come
    assert index.apply(snap(2, 1, True, 5)) is Outcome.SNAPSHOT
    assert index.blocks("w0") == {1, 4, 5}
    assert index.matched_all([1, 2]) == {"w0": 1}
    assert index.matched_all([4, 5]) == {"w0": 2}
    assert index.matched_all([2, 3]) == {"w0": 0}
    assert index.stats().snapshots == 1


def test_a_gap_silences_a_worker_until_its_snapshot() -> None:
    index = PrefixIndex()
    index.apply(delta(0, Stored(1, 0), Stored(2, 1)))
    index.apply(delta(0, Stored(1, 0), Stored(2, 1), worker="w1"))
    assert index.apply(delta(2, Stored(3, 2))) is Outcome.GAP
    assert index.apply(delta(3, Stored(4, 3))) is Outcome.IGNORED
    assert index.wanting_snapshot() == ["w0"] and not index.synced("w0")
    assert index.matched("w0", [1, 2]) == 0
    assert index.matched_all([1, 2]) == {"w0": 0, "w1": 2}
    assert index.apply(snap(1, 0, True, 1, 2)) is Outcome.STALE  # older than seen
    assert index.apply(snap(4, 0, False, 1, 2)) is Outcome.APPLIED
    assert index.matched("w0", [1, 2]) == 0  # not before the final part
    assert index.apply(snap(5, 1, True, 3, 4)) is Outcome.SNAPSHOT
    assert index.matched_all([1, 2, 3, 4, 9]) == {"w0": 4, "w1": 2}
    stats = index.stats()
    assert (stats.gaps, stats.snapshots, stats.stale, stats.unsynced) == (1, 1, 1, [])
    assert stats.blocks == {"w0": 4, "w1": 2} and stats.batches == 7


def test_snapshot_parts_out_of_protocol_are_not_believed() -> None:
    index = PrefixIndex()
    index.apply(delta(0, Stored(1, 0)))
    assert index.apply(snap(1, 1, True, 7)) is Outcome.IGNORED  # a part 1 without part 0
    assert index.apply(snap(2, 0, False, 1)) is Outcome.APPLIED
    assert index.apply(snap(3, 2, True, 8)) is Outcome.IGNORED  # part 2 after part 0
    assert index.apply(snap(4, 1, True, 9)) is Outcome.IGNORED  # that snapshot is abandoned
    assert index.blocks("w0") == {1} and index.synced("w0")
    assert index.apply(snap(5, 0, False, 1, 7)) is Outcome.APPLIED
    assert index.apply(snap(6, 0, False, 1)) is Outcome.APPLIED  # the worker began again
    assert index.apply(snap(7, 1, True, 2)) is Outcome.SNAPSHOT
    assert index.blocks("w0") == {1, 2}
    assert index.apply(snap(8, 0, False, 1)) is Outcome.APPLIED
    assert index.apply(snap(10, 2, True, 6)) is Outcome.GAP  # part 1 missed
    assert index.blocks("w0") == set() and index.wanting_snapshot() == ["w0"]


def test_a_restart_drops_the_old_process_and_its_late_batches() -> None:
    index = PrefixIndex()
    index.apply(delta(0, Stored(1, 0), Stored(2, 1)))
    index.apply(delta(1, Removed(2)))
    assert index.apply(delta(0, Stored(5, 0), incarnation=2.0)) is Outcome.APPLIED
    assert index.blocks("w0") == {5} and index.position("w0") == (2.0, 0)
    assert index.apply(delta(2, Stored(1, 0), incarnation=1.0)) is Outcome.STALE
    assert index.matched_all([1]) == {"w0": 0} and index.matched_all([5]) == {"w0": 1}
    assert index.apply(delta(3, Stored(6, 5), incarnation=3.0)) is Outcome.GAP  # joined late
    assert index.stats().restarts == 2 and index.blocks("w0") == set()


def test_forget_drops_a_worker_and_its_slot_is_reused_clean() -> None:
    index = PrefixIndex()
    index.apply(delta(0, Stored(1, 0), Stored(2, 1), worker="a"))
    index.apply(delta(0, Stored(1, 0), worker="b"))
    index.forget("a")
    index.forget("nobody")
    assert index.matched_all([1, 2]) == {"b": 1}
    assert index.position("a") is None and index.matched("a", [1]) == 0
    index.apply(delta(0, Stored(9, 0), worker="c"))  # takes a's slot
    assert index.matched_all([1, 2]) == {"b": 1, "c": 0}
    assert index.matched_all([9]) == {"b": 0, "c": 1}
    assert index.matched_all([]) == {"b": 0, "c": 0}
    assert index.stats().blocks == {"b": 1, "c": 1}

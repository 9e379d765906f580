"""Decode-side reservations (workers/handoff/reservations.py) as a state machine, under hypothesis.

The real :class:`~workers.handoff.reservations.Reservations` runs over a real
:class:`~workers.core.scheduler.Scheduler` (and its
:class:`~workers.core.block_manager.BlockManager`) without a pool, its clock replaced by a fake one.
Rules make the calls the engine makes: reserve (never taking pages the scheduler's queued requests
wait for), take-over (``Engine.adopt``: take, commit, resume; or enqueue afresh when there is no
matching reservation), abort (``Engine.abort``: release, else finish), lease expiry, ordinary
requests and scheduler steps. After every rule:

- page accounting is exact: every page's refcount is the number of holders (reservations,
  running and waiting requests) listing it, free pages are exactly the unheld ones, and
  ``free uncached + free cached (evictable) + held == total``;
- no reservation outlives its lease once expiry ran; released and expired ids are gone
  and can be reserved again;
- at the end, releasing every reservation and aborting every request returns every page.
"""

from __future__ import annotations

from collections import Counter
from unittest import mock

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

import workers.handoff.reservations as reservations_module
from kvpool.hashing import Namespace, PrefixHasher
from tests.unit.machine_settings import STATEFUL
from workers.core.scheduler import Scheduler, SchedulerConfig
from workers.core.sequence import FinishReason, SamplingParams, SeqStatus, Sequence
from workers.handoff.reservations import Reservations

HASHER = PrefixHasher(Namespace(model="rm@0", dtype="float32", block_tokens=4), b"key")
FIRST_TOKEN = 9
FAKE_TOKEN = 8
RESERVATION_IDS = tuple(f"r{i}" for i in range(5))
LEASES = (0.0, 0.5, 1.0, 3.0)
# Prompts over a tiny alphabet, built on a few shared prefixes, so that reservations and
# requests often take each other's cached blocks.
PREFIXES = ((1, 2, 1, 2, 3, 3, 1, 2, 2, 1, 3, 1), (4, 4, 5, 4, 5, 5, 4, 4, 5, 5, 4, 5))
SALTS = ("", "", "tenant-b")
"""Cache salts (hash roots): an unsalted request never shares a block with a salted one."""


class FakeClock:
    """Stands in for the ``time`` module inside workers.handoff.reservations."""

    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now


prompts = st.builds(
    lambda p, n, tail: list(PREFIXES[p][:n]) + tail or [1],
    st.integers(min_value=0, max_value=len(PREFIXES) - 1),
    st.integers(min_value=0, max_value=len(PREFIXES[0])),
    st.lists(st.integers(min_value=1, max_value=5), max_size=6),
)


class ReservationMachine(RuleBasedStateMachine):
    """Reserve / take / abort / expire / add / step in any order, checked after each."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self._patch = mock.patch.object(reservations_module, "time", self.clock)
        self._patch.start()
        self.sched = self._scheduler(num_blocks=12, block_tokens=4, max_model_len=40)
        self.res = Reservations(self.sched, None, streaming=False)
        self.reserved: dict[str, tuple[Sequence, float]] = {}
        """Model: request id -> (its reserved sequence, the expiry of its lease)."""
        self.made_at: dict[str, int] = {}
        """Model: request id -> how many expiries had run when it was reserved."""
        self.live: dict[str, Sequence] = {}
        """Model: requests queued or running in the scheduler (taken over, or ordinary)."""
        self.retired: set[str] = set()
        """Reservation ids released or expired (free to be used again)."""
        self.expiries = 0
        self.last_expiry = float("-inf")
        self.next_request = 0

    @staticmethod
    def _scheduler(num_blocks: int, block_tokens: int, max_model_len: int) -> Scheduler:
        config = SchedulerConfig(
            num_blocks=num_blocks,
            block_tokens=block_tokens,
            max_num_seqs=3,
            max_num_batched_tokens=6,
            max_model_len=max_model_len,
        )
        return Scheduler(config, HASHER)

    @initialize(
        num_blocks=st.integers(min_value=6, max_value=16),
        block_tokens=st.sampled_from([2, 4]),
        max_model_len=st.integers(min_value=16, max_value=48),
    )
    def setup(self, num_blocks: int, block_tokens: int, max_model_len: int) -> None:
        self.sched = self._scheduler(num_blocks, block_tokens, max_model_len)
        self.res = Reservations(self.sched, None, streaming=False)

    # -- helpers ------------------------------------------------------------------------
    @property
    def pool_state(self) -> tuple[int, list[int]]:
        pool = self.sched.blocks.pool
        return pool.num_free, list(pool.ref_counts)

    def _in_use(self, request_id: str) -> bool:
        """What ``Engine._check_new`` refuses: an id reserved or of a live request."""
        return request_id in self.reserved or request_id in self.live

    def _fits_ever(self, num_tokens: int, max_tokens: int) -> bool:
        config = self.sched.config
        total = num_tokens + max_tokens
        pages = self.sched.blocks.blocks_for(total - 1)
        return total <= config.max_model_len and pages <= config.num_blocks

    def _enqueue(
        self, request_id: str, tokens: list[int], prompt: int, max_tokens: int, salt: str = ""
    ) -> None:
        """``Engine._enqueue``: a new request in ``waiting`` (ValueError if it never fits)."""
        seq = Sequence(request_id, tokens, SamplingParams(max_tokens=max_tokens), prompt)
        seq.hash_root = HASHER.root(salt)
        if not self._fits_ever(prompt, max_tokens):
            with pytest.raises(ValueError):
                self.sched.add(seq)
            return
        self.sched.add(seq)
        self.live[request_id] = seq

    def _owed(self) -> int:
        """Pages a reservation must leave to the requests queued in the scheduler: all the
        tokens of each (0 with none queued)."""
        return sum(self.sched.blocks.blocks_for(s.num_tokens) for s in self.sched.waiting)

    def _settle(self) -> None:
        self.live = {rid: s for rid, s in self.live.items() if not s.is_finished}

    def _hold(self, request_id: str, seq: Sequence, lease: float) -> None:
        self.reserved[request_id] = (seq, self.clock.now + lease)
        self.made_at[request_id] = self.expiries
        self.retired.discard(request_id)

    def _retire(self, request_id: str) -> None:
        seq, _ = self.reserved.pop(request_id)
        assert request_id not in self.res
        assert seq.is_finished and seq.finish_reason is FinishReason.ABORT
        assert seq.block_table == []
        self.retired.add(request_id)

    # -- rules --------------------------------------------------------------------------
    @rule(
        request_id=st.sampled_from(RESERVATION_IDS),
        prompt=prompts,
        max_tokens=st.integers(min_value=1, max_value=10),
        lease=st.sampled_from(LEASES),
        salt=st.sampled_from(SALTS),
    )
    def reserve(
        self, request_id: str, prompt: list[int], max_tokens: int, lease: float, salt: str
    ) -> None:
        if self._in_use(request_id):
            return  # the engine refuses a duplicate id before reservations see it
        before = self.pool_state
        root = HASHER.root(salt)
        if not self._fits_ever(len(prompt), max_tokens):
            event("reserve: never fits")
            with pytest.raises(ValueError):
                self.res.reserve(request_id, prompt, max_tokens, lease, root)
            assert request_id not in self.res and self.pool_state == before
            return
        need, owed = self.sched.blocks.blocks_for(len(prompt)), self._owed()
        seq = self.res.reserve(request_id, prompt, max_tokens, lease, root)
        if owed and before[0] < need + owed:
            assert seq is None, "a reservation took pages the queued requests wait for"
        if seq is None:
            event("reserve: no pages now" + (" (owed to the queue)" if owed else ""))
            # Refused only when short of pages, those owed to the queued requests aside: a
            # prompt never needs more pages than it has blocks, prefix hits (even revived
            # free ones) included.
            assert before[0] < need + owed
            assert request_id not in self.res and self.pool_state == before
            return
        event("reserve: granted" + (" with prefix hits" if seq.num_cached_tokens else ""))
        assert seq.status is SeqStatus.RESERVED and seq.token_ids == prompt
        assert len(seq.block_table) == self.sched.blocks.blocks_for(len(prompt))
        assert request_id in self.res and self.res.landing(request_id) is None
        self._hold(request_id, seq, lease)

    @precondition(lambda self: bool(self.retired - set(self.reserved) - set(self.live)))
    @rule(data=st.data(), lease=st.sampled_from(LEASES))
    def reserve_retired_id_again(self, data: st.DataObject, lease: float) -> None:
        """A released or expired id is forgotten: it reserves again when a page is free."""
        free = sorted(self.retired - set(self.reserved) - set(self.live))
        request_id = data.draw(st.sampled_from(free))
        owed = self._owed()
        seq = self.res.reserve(request_id, [FAKE_TOKEN], 1, lease)
        if self.sched.blocks.pool.num_free < 1 + owed and seq is None:
            return
        assert seq is not None, "a retired id could not be reserved with a page free"
        self._hold(request_id, seq, lease)

    @rule(
        data=st.data(),
        same_prompt=st.sampled_from([True, True, False]),
        max_tokens=st.integers(min_value=1, max_value=6),
    )
    def adopt(self, data: st.DataObject, same_prompt: bool, max_tokens: int) -> None:
        """``Engine.adopt``: take the reservation over (commit, first token, resume), or,
        with none for this prompt, queue the request afresh."""
        # Mostly a held id (the usual hand-over), sometimes any id (expired, never made).
        request_id = data.draw(st.sampled_from(sorted(self.reserved) * 3 + list(RESERVATION_IDS)))
        if request_id in self.live:
            return  # a second Generate for a running request is refused by the engine
        held = self.reserved.get(request_id)
        prompt = list(held[0].token_ids) if held else [3, 1, 2]
        if not same_prompt:
            prompt = [*prompt, 5]
        taken = self.res.take(request_id, prompt)
        seq, landing = (taken.seq, taken.landing) if taken is not None else (None, None)
        assert landing is None  # no pool: nothing lands
        assert request_id not in self.res
        event(f"adopt: {'no reservation' if held is None else 'same' if same_prompt else 'other'}")
        if held is not None and same_prompt:
            assert seq is held[0]
            del self.reserved[request_id]
            seq.params = SamplingParams(max_tokens=max_tokens)
            self.sched.blocks.commit(seq)
            seq.token_ids.append(FIRST_TOKEN)
            self.sched.resume(seq)
            assert seq.status is SeqStatus.RUNNING
            self.live[request_id] = seq
            return
        assert seq is None
        if held is not None:  # a reservation for another prompt was released
            self._retire(request_id)
        if max_tokens > 1:  # else Engine.resume refuses it: the first token was the last
            self._enqueue(request_id, [*prompt, FIRST_TOKEN], len(prompt), max_tokens)

    @rule(request_id=st.sampled_from(RESERVATION_IDS))
    def abort(self, request_id: str) -> None:
        """``Engine.abort``: a reservation is released; else a live request is finished."""
        released = self.res.release(request_id)
        assert released == (request_id in self.reserved)
        if released:
            self._retire(request_id)
            return
        seq = self.live.pop(request_id, None)
        if seq is not None:
            self.sched.finish(seq, FinishReason.ABORT)
            assert seq.block_table == []
        assert not self.res.release(request_id)  # releasing twice finds nothing

    @rule(
        dt=st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.0]),
        to_deadline=st.booleans(),
        explicit=st.booleans(),
    )
    def expire(self, dt: float, to_deadline: bool, explicit: bool) -> None:
        """Time passes (sometimes exactly to a lease's end) and expiry runs."""
        deadlines = sorted(until for _, until in self.reserved.values())
        if to_deadline and deadlines:
            self.clock.now = max(self.clock.now, deadlines[0])
        else:
            self.clock.now += dt
        now = self.clock.now
        due = sorted(rid for rid, (_, until) in self.reserved.items() if until <= now)
        count = self.res.expire(now) if explicit else self.res.expire()
        assert count == len(due)
        event(f"expire: released {min(count, 2)}{'+' if count >= 2 else ''}")
        for request_id in due:
            self._retire(request_id)
        self.expiries += 1
        self.last_expiry = now

    @rule(
        prompt=prompts,
        max_tokens=st.integers(min_value=1, max_value=6),
        salt=st.sampled_from(SALTS),
    )
    def add_request(self, prompt: list[int], max_tokens: int, salt: str) -> None:
        """An ordinary request (a prompt this worker prefills itself)."""
        request_id = f"q{self.next_request}"
        self.next_request += 1
        self._enqueue(request_id, prompt, len(prompt), max_tokens, salt)

    @rule()
    def step(self) -> None:
        """One scheduler step, then what the engine does after the model ran."""
        batch = self.sched.schedule()
        assert all(s.status is not SeqStatus.RESERVED for s, _ in batch.entries)
        self.sched.update(batch)
        for seq, _ in batch.entries:
            if seq.num_computed_tokens == seq.num_tokens:
                seq.token_ids.append(FAKE_TOKEN)
                if seq.num_output_tokens >= seq.params.max_tokens:
                    self.sched.finish(seq, FinishReason.LENGTH)
        self._settle()

    # -- invariants ---------------------------------------------------------------------
    @invariant()
    def pages_are_accounted_for(self) -> None:
        """Refcount of each page == holders listing it; free == unheld; the sum is total."""
        pool = self.sched.blocks.pool
        holders = [s for s, _ in self.reserved.values()] + list(self.live.values())
        assert {id(s) for s in self.sched.running} | {id(s) for s in self.sched.waiting} == {
            id(s) for s in self.live.values()
        }
        listed: Counter[int] = Counter()
        for seq in holders:
            assert len(set(seq.block_table)) == len(seq.block_table)
            listed.update(seq.block_table)
        assert pool.ref_counts == [listed[p] for p in range(pool.num_blocks)]
        held = set(listed)
        free = pool.free_order()
        assert len(free) == len(set(free)) == pool.num_free
        assert set(free) == set(range(pool.num_blocks)) - held
        evictable = [p for p in free if pool.block_hash[p] is not None]
        uncached = [p for p in free if pool.block_hash[p] is None]
        assert len(uncached) + len(evictable) + len(held) == pool.num_blocks
        for page, name in enumerate(pool.block_hash):
            if name is not None:
                assert pool.lookup(name) == page

    @invariant()
    def reservations_match_the_model(self) -> None:
        assert len(self.res) == len(self.reserved)
        for request_id, (seq, _) in self.reserved.items():
            assert request_id in self.res
            assert seq.status is SeqStatus.RESERVED
            assert len(seq.block_table) == self.sched.blocks.blocks_for(seq.num_prompt_tokens)
        for request_id in self.retired - set(self.reserved):
            assert request_id not in self.res

    @invariant()
    def no_reservation_outlives_its_lease(self) -> None:
        """Once expiry ran at time t, every reservation made before it ends after t."""
        now = self.last_expiry
        for request_id, (_, until) in self.reserved.items():
            if self.made_at[request_id] < self.expiries:
                assert until > now, f"{request_id} outlived its lease ({until} <= {now})"

    def teardown(self) -> None:
        try:
            for request_id in list(self.reserved):
                assert self.res.release(request_id)
                self._retire(request_id)
            for seq in self.live.values():
                self.sched.finish(seq, FinishReason.ABORT)
            self.live.clear()
            pool = self.sched.blocks.pool
            assert len(self.res) == 0 and not self.sched.has_work
            assert pool.num_free == pool.num_blocks
            assert pool.ref_counts == [0] * pool.num_blocks
        finally:
            self.res.close()
            self._patch.stop()


ReservationMachine.TestCase.settings = settings(STATEFUL, max_examples=100)  # ~5 s of CPU
TestReservationMachine = ReservationMachine.TestCase


def test_a_reservation_leaves_the_queued_requests_their_pages() -> None:
    """Pages a queued request waits for are not reserved, though free: once it runs, what
    is left can be."""
    sched = ReservationMachine._scheduler(num_blocks=10, block_tokens=2, max_model_len=20)
    res = Reservations(sched, None, streaming=False)
    assert res.reserve("early", [1, 2, 3, 4, 5, 6, 7, 8], 1, 30.0) is not None  # 4 pages
    sched.add(Sequence("queued", [9] * 9, SamplingParams(max_tokens=1)))  # owed 5 of 6
    assert res.owed_pages() == 5
    assert res.reserve("late", [7, 7, 7], 1, 30.0) is None  # 2 pages: only 1 is not owed
    batch = sched.schedule()
    assert [s.request_id for s, _ in batch.entries] == ["queued"] and not sched.waiting
    assert res.reserve("late", [7], 1, 30.0) is not None
    res.close()


def test_close_releases_every_reservation() -> None:
    """``Reservations.close`` (worker shutdown) gives back every reserved page."""
    sched = ReservationMachine._scheduler(num_blocks=10, block_tokens=2, max_model_len=20)
    res = Reservations(sched, None, streaming=False)
    for i in range(3):
        assert res.reserve(f"r{i}", [1, 2, 1, 2, i + 3], 2, 30.0) is not None
    assert sched.blocks.pool.num_free == 1
    res.close()
    assert len(res) == 0
    assert sched.blocks.pool.num_free == 10
    assert sched.blocks.pool.ref_counts == [0] * 10


def test_an_illegal_transition_raises_and_terminal_states_are_final() -> None:
    from workers.handoff.reservation import (
        TRANSITIONS,
        HandoffState,
        IllegalTransitionError,
        Reservation,
    )

    seq = Sequence("t1", [1, 2, 3], SamplingParams(max_tokens=2))
    held = Reservation(seq, deadline=0.0)
    with pytest.raises(IllegalTransitionError):
        held.move(HandoffState.ADOPTED)  # never adopted without landing first
    held.move(HandoffState.LANDED)
    held.move(HandoffState.ADOPTED)
    for state in HandoffState:
        with pytest.raises(IllegalTransitionError):
            held.move(state)
    assert all(not TRANSITIONS[s] for s in (HandoffState.EXPIRED, HandoffState.CANCELLED))

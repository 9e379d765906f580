"""BlockPool: page ids, refcounts, the LRU free list and the prefix-cache index, exactly."""

from __future__ import annotations

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from proto.kv_events import Removed, Stored
from tests.unit.machine_settings import STATEFUL
from workers.core.block_pool import BlockPool

# -- construction ------------------------------------------------------------------------------


def test_rejects_non_positive_size() -> None:
    with pytest.raises(ValueError, match="num_blocks must be positive"):
        BlockPool(0)
    with pytest.raises(ValueError):
        BlockPool(-3)


def test_starts_all_free_in_id_order() -> None:
    pool = BlockPool(5)
    assert pool.num_blocks == 5
    assert pool.num_free == 5
    assert pool.num_used == 0
    assert pool.free_order() == [0, 1, 2, 3, 4]
    assert pool.ref_counts == [0, 0, 0, 0, 0]
    assert pool.block_hash == [None] * 5


# -- allocate ----------------------------------------------------------------------------------


def test_allocate_hands_out_lowest_ids_first() -> None:
    pool = BlockPool(6)
    assert pool.allocate(2) == [0, 1]
    assert pool.allocate(3) == [2, 3, 4]
    assert pool.ref_counts == [1, 1, 1, 1, 1, 0]
    assert pool.free_order() == [5]
    assert pool.num_free == 1
    assert pool.num_used == 5


def test_allocate_zero_is_a_no_op() -> None:
    pool = BlockPool(2)
    assert pool.allocate(0) == []
    assert pool.free_order() == [0, 1]


def test_can_allocate_boundary() -> None:
    pool = BlockPool(3)
    pool.allocate(1)
    assert pool.can_allocate(0)
    assert pool.can_allocate(2)
    assert not pool.can_allocate(3)


def test_allocate_beyond_free_raises_and_changes_nothing() -> None:
    pool = BlockPool(4)
    pool.allocate(3)
    with pytest.raises(RuntimeError, match="asked for 2 pages with 1 free"):
        pool.allocate(2)
    assert pool.free_order() == [3]
    assert pool.ref_counts == [1, 1, 1, 0]
    assert pool.allocate(1) == [3]
    with pytest.raises(RuntimeError):
        pool.allocate(1)


# -- free and the LRU order --------------------------------------------------------------------


def test_free_appends_to_tail_in_given_order() -> None:
    pool = BlockPool(5)
    pool.allocate(4)  # 0 1 2 3; free: [4]
    pool.free([2, 0])
    assert pool.free_order() == [4, 2, 0]
    pool.free([3])
    assert pool.free_order() == [4, 2, 0, 3]
    assert pool.ref_counts == [0, 1, 0, 0, 0]
    # least recently freed first
    assert pool.allocate(3) == [4, 2, 0]
    assert pool.free_order() == [3]


def test_free_of_shared_page_only_drops_one_reference() -> None:
    pool = BlockPool(3)
    (page,) = pool.allocate(1)
    pool.touch([page])
    assert pool.ref_counts[page] == 2
    pool.free([page])
    assert pool.ref_counts[page] == 1
    assert page not in pool.free_order()
    pool.free([page])
    assert pool.ref_counts[page] == 0
    assert pool.free_order() == [1, 2, 0]


def test_double_free_raises() -> None:
    pool = BlockPool(2)
    (page,) = pool.allocate(1)
    pool.free([page])
    with pytest.raises(AssertionError, match="double free of page 0"):
        pool.free([page])
    assert pool.ref_counts == [0, 0]
    assert pool.free_order() == [1, 0]


def test_free_of_never_allocated_page_raises() -> None:
    pool = BlockPool(2)
    with pytest.raises(AssertionError, match="double free"):
        pool.free([1])


def test_free_same_page_twice_in_one_call_raises() -> None:
    pool = BlockPool(2)
    pool.allocate(1)
    with pytest.raises(AssertionError):
        pool.free([0, 0])


# -- the prefix-cache index --------------------------------------------------------------------


def test_cache_and_lookup() -> None:
    pool = BlockPool(3)
    a, b = pool.allocate(2)
    assert pool.lookup(111) is None
    pool.cache(a, 111)
    pool.cache(b, 222)
    assert pool.lookup(111) == a
    assert pool.lookup(222) == b
    assert pool.block_hash == [111, 222, None]


def test_cache_of_unowned_page_raises() -> None:
    pool = BlockPool(2)
    with pytest.raises(AssertionError, match="caching unowned page 1"):
        pool.cache(1, 5)
    assert pool.lookup(5) is None


def test_cache_first_writer_wins_per_hash() -> None:
    pool = BlockPool(3)
    a, b = pool.allocate(2)
    pool.cache(a, 7)
    pool.cache(b, 7)  # same content computed twice: the first page keeps the name
    assert pool.lookup(7) == a
    assert pool.block_hash[b] is None


def test_cache_first_writer_wins_per_page() -> None:
    pool = BlockPool(3)
    (a,) = pool.allocate(1)
    pool.cache(a, 7)
    pool.cache(a, 8)  # a page keeps its first name
    assert pool.lookup(7) == a
    assert pool.lookup(8) is None
    assert pool.block_hash[a] == 7


def test_freed_page_keeps_its_hash_until_reallocated() -> None:
    pool = BlockPool(3)
    a, b = pool.allocate(2)
    pool.cache(a, 10)
    pool.cache(b, 20)
    pool.free([b, a])
    assert pool.free_order() == [2, 1, 0]
    assert pool.lookup(10) == a
    assert pool.lookup(20) == b
    # the first allocation takes page 2 (never cached): nothing is evicted
    assert pool.allocate(1) == [2]
    assert pool.lookup(10) == a
    assert pool.lookup(20) == b
    # the next one takes page 1 and evicts hash 20 only
    assert pool.allocate(1) == [1]
    assert pool.lookup(20) is None
    assert pool.block_hash[1] is None
    assert pool.lookup(10) == a
    assert pool.block_hash[0] == 10
    # and the last one evicts hash 10
    assert pool.allocate(1) == [0]
    assert pool.lookup(10) is None
    assert pool.block_hash == [None, None, None]


def test_evicted_hash_can_be_claimed_by_another_page() -> None:
    pool = BlockPool(2)
    a, b = pool.allocate(2)
    pool.cache(a, 5)
    pool.free([a])
    assert pool.allocate(1) == [a]  # evicts 5
    pool.cache(b, 5)
    assert pool.lookup(5) == b
    assert pool.block_hash == [None, 5]


def test_touch_revives_a_free_cached_page() -> None:
    pool = BlockPool(4)
    a, b, c = pool.allocate(3)
    pool.cache(b, 99)
    pool.free([a, b, c])
    assert pool.free_order() == [3, 0, 1, 2]
    page = pool.lookup(99)
    assert page == b
    pool.touch([page])
    assert pool.ref_counts == [0, 1, 0, 0]
    assert pool.free_order() == [3, 0, 2]
    assert pool.num_free == 3
    assert pool.num_used == 1
    assert pool.lookup(99) == b  # still named
    # freeing it again puts it at the tail
    pool.free([b])
    assert pool.free_order() == [3, 0, 2, 1]
    assert pool.lookup(99) == b


def test_touch_of_used_page_adds_a_reference() -> None:
    pool = BlockPool(2)
    (a,) = pool.allocate(1)
    pool.touch([a, a])
    assert pool.ref_counts[a] == 3
    assert pool.free_order() == [1]


def test_reset_prefix_cache_forgets_names_not_owners() -> None:
    pool = BlockPool(3)
    a, b = pool.allocate(2)
    pool.cache(a, 1)
    pool.cache(b, 2)
    pool.free([b])
    pool.reset_prefix_cache()
    assert pool.lookup(1) is None
    assert pool.lookup(2) is None
    assert pool.block_hash == [None, None, None]
    assert pool.ref_counts == [1, 0, 0]
    assert pool.free_order() == [2, 1]
    # names can be given again after a reset
    pool.cache(a, 2)
    assert pool.lookup(2) == a


# -- stateful model check ----------------------------------------------------------------------


class PoolMachine(RuleBasedStateMachine):
    """BlockPool against a plain-list model of the free order, refcounts and names; its KV
    events, replayed in order over an empty set, give exactly the names it holds."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = BlockPool(1)
        self.refs: list[int] = []
        self.free: list[int] = []
        self.name_of: dict[int, int] = {}  # page -> hash
        self.held: list[int] = []  # one entry per reference taken by a client
        self.replayed: set[int] = set()  # the names the pool's events say it holds

    @initialize(num_blocks=st.integers(min_value=1, max_value=8))
    def setup(self, num_blocks: int) -> None:
        self.pool = BlockPool(num_blocks)
        self.pool.log_events()
        self.refs = [0] * num_blocks
        self.free = list(range(num_blocks))
        self.name_of = {}
        self.held = []
        self.replayed = set()

    def _page_of(self, h: int) -> int | None:
        for page, name in self.name_of.items():
            if name == h:
                return page
        return None

    @rule(n=st.integers(min_value=0, max_value=9))
    def allocate(self, n: int) -> None:
        if n > len(self.free):
            with pytest.raises(RuntimeError):
                self.pool.allocate(n)
            return
        expected, self.free = self.free[:n], self.free[n:]
        assert self.pool.allocate(n) == expected
        for page in expected:
            self.name_of.pop(page, None)
            self.refs[page] = 1
            self.held.append(page)

    @precondition(lambda self: bool(self.held))
    @rule(data=st.data())
    def free_some(self, data: st.DataObject) -> None:
        k = data.draw(st.integers(min_value=1, max_value=len(self.held)))
        idxs = data.draw(
            st.lists(
                st.integers(min_value=0, max_value=len(self.held) - 1),
                min_size=k,
                max_size=k,
                unique=True,
            )
        )
        pages = [self.held[i] for i in idxs]
        for i in sorted(idxs, reverse=True):
            del self.held[i]
        self.pool.free(pages)
        for page in pages:
            self.refs[page] -= 1
            if self.refs[page] == 0:
                self.free.append(page)

    @precondition(lambda self: any(r == 0 for r in self.refs))
    @rule(data=st.data())
    def double_free(self, data: st.DataObject) -> None:
        page = data.draw(st.sampled_from([p for p, r in enumerate(self.refs) if r == 0]))
        with pytest.raises(AssertionError):
            self.pool.free([page])

    @precondition(lambda self: bool(self.held))
    @rule(data=st.data(), h=st.integers(min_value=0, max_value=5))
    def cache(self, data: st.DataObject, h: int) -> None:
        page = data.draw(st.sampled_from(self.held))
        self.pool.cache(page, h, h + 100)
        if self._page_of(h) is None and page not in self.name_of:
            self.name_of[page] = h

    @precondition(lambda self: any(r == 0 for r in self.refs))
    @rule(data=st.data(), h=st.integers(min_value=0, max_value=5))
    def cache_unowned(self, data: st.DataObject, h: int) -> None:
        page = data.draw(st.sampled_from([p for p, r in enumerate(self.refs) if r == 0]))
        with pytest.raises(AssertionError):
            self.pool.cache(page, h)

    @rule(h=st.integers(min_value=0, max_value=5))
    def lookup_and_touch(self, h: int) -> None:
        page = self.pool.lookup(h)
        assert page == self._page_of(h)
        if page is None:
            return
        self.pool.touch([page])
        if self.refs[page] == 0:
            self.free.remove(page)
        self.refs[page] += 1
        self.held.append(page)

    @rule()
    def reset(self) -> None:
        self.pool.reset_prefix_cache()
        self.name_of = {}

    @invariant()
    def matches_model(self) -> None:
        pool = self.pool
        assert pool.num_free + pool.num_used == pool.num_blocks
        assert pool.free_order() == self.free
        assert pool.ref_counts == self.refs
        assert sum(pool.ref_counts) == len(self.held)
        assert pool.num_free == sum(1 for r in pool.ref_counts if r == 0)
        for page in range(pool.num_blocks):
            assert pool.block_hash[page] == self.name_of.get(page)
        for page, h in self.name_of.items():
            assert pool.lookup(h) == page
        for event in pool.take_events():
            if isinstance(event, Stored):
                assert event.hash not in self.replayed and event.parent == event.hash + 100
                self.replayed.add(event.hash)
            else:
                self.replayed.remove(event.hash)
        assert self.replayed == set(self.name_of.values()) == set(pool.cached_names())

    def teardown(self) -> None:
        self.pool.free(list(self.held))
        assert self.pool.num_free == self.pool.num_blocks
        assert self.pool.ref_counts == [0] * self.pool.num_blocks


PoolMachine.TestCase.settings = STATEFUL
TestPoolMachine = PoolMachine.TestCase


def test_events_are_logged_only_once_asked() -> None:
    pool = BlockPool(2)
    (page,) = pool.allocate(1)
    pool.cache(page, 7, 1)
    assert pool.take_events() == []
    pool.log_events()
    pool.free([page])
    pool.allocate(2)  # evicts 7
    assert pool.take_events() == [Removed(7)]
    assert pool.take_events() == []

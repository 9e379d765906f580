"""The router's expectations of what its placements put in workers' caches
(router/placement/expected_blocks.py): exact cases, then a model under any sequence of
operations."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proto.kv_events import EventBatch, KVEvent, Removed, Stored
from router.placement.expected_blocks import ExpectedBlocks


def batch(worker_id: str, *events: KVEvent) -> EventBatch:
    return EventBatch(worker_id, 1.0, 0, tuple(events))


def test_a_placement_is_expected_until_its_ttl() -> None:
    expected = ExpectedBlocks(ttl_s=10.0)
    expected.placed(["a", "b"], [1, 2, 3], now=0.0)
    assert expected.extend({}, [1, 2, 3, 4], 9.9) == {"a": 3, "b": 3}
    assert expected.extend({"c": 1}, [1, 2], 9.9) == {"a": 2, "b": 2, "c": 1}
    assert expected.extend({}, [9, 1, 2], 9.9) == {}  # no prediction where none matched
    assert expected.extend({"a": 1}, [1, 2, 3], 10.0) == {"a": 1}


def test_it_continues_the_index_match() -> None:
    expected = ExpectedBlocks()
    expected.placed(["a"], [1, 2, 3, 4], now=0.0)
    # the index already has 1 and 2 (stored earlier): the walk goes on from there
    assert expected.extend({"a": 2, "b": 4}, [1, 2, 3, 4, 5], 1.0) == {"a": 4, "b": 4}


def test_events_confirm_or_deny_it() -> None:
    expected = ExpectedBlocks()
    expected.placed(["a", "b"], [1, 2, 3], now=0.0)
    expected.observe(batch("a", Stored(1, 0), Stored(2, 1)))
    expected.observe(batch("b", Removed(3)))
    assert expected.extend({"a": 2}, [1, 2, 3], 1.0) == {"a": 3, "b": 2}
    assert expected.extend({}, [1, 2, 3], 1.0) == {"b": 2}
    expected.observe(batch("c", Removed(1)))  # nothing was expected of c
    expected.forget("b")
    assert expected.extend({"a": 0}, [1, 2, 3], 1.0) == {"a": 0}
    assert expected.extend({}, [1, 2], 1.0) == {}


def test_a_later_end_keeps_a_shared_block() -> None:
    expected = ExpectedBlocks(ttl_s=10.0)
    expected.placed(["a"], [1, 2], now=0.0)
    expected.placed(["a"], [1, 5], now=4.0, until=6.0)  # ends sooner: 1 stays until 10
    assert expected.extend({}, [1, 5], 6.0) == {"a": 1}
    assert expected.extend({}, [1, 2], 9.0) == {"a": 2}
    expected.placed(["a"], [7], now=9.0, until=9.0)  # already over: nothing
    assert expected.extend({}, [7], 9.0) == {}
    assert expected.extend({}, [1, 2], 10.0) == {}


def test_the_ttl_must_be_positive() -> None:
    with pytest.raises(ValueError, match="ttl_s"):
        ExpectedBlocks(ttl_s=0.0)


# --- a model: every placement remembered, ended by its time or a later event ------------


@dataclass
class Placement:
    worker_id: str
    names: frozenset[int]
    until: float
    ended: set[int]
    """Names whose expectation an event ended after this placement."""


def model_extend(
    placements: list[Placement], matched: dict[str, int], chain: list[int], now: float
) -> dict[str, int]:
    def held(worker_id: str, name: int) -> bool:
        return any(
            p.worker_id == worker_id and name in p.names and name not in p.ended and p.until > now
            for p in placements
        )

    out = dict(matched)
    for worker_id in {p.worker_id for p in placements}:
        start = end = out.get(worker_id, 0)
        while end < len(chain) and held(worker_id, chain[end]):
            end += 1
        if end > start or worker_id in out:
            out[worker_id] = end
    return out


workers = st.sampled_from(["a", "b", "c"])
chains = st.lists(st.integers(1, 6), min_size=0, max_size=5, unique=True)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("place"), st.lists(workers, max_size=2), chains, st.floats(0, 12)),
        st.tuples(st.just("event"), workers, st.integers(1, 6)),
        st.tuples(st.just("wait"), st.floats(0, 6)),
        st.tuples(st.just("ask"), chains, st.dictionaries(workers, st.integers(0, 3))),
        st.tuples(st.just("forget"), workers),
    ),
    max_size=30,
)


@settings(max_examples=300, deadline=None)
@given(operations)
def test_it_matches_the_model(ops: list[tuple]) -> None:  # type: ignore[type-arg]
    expected = ExpectedBlocks(ttl_s=8.0)
    placements: list[Placement] = []
    now = 0.0
    for op in ops:
        if op[0] == "place":
            _, ids, chain, length = op
            expected.placed(ids, chain, now, now + length)
            until = min(now + length, now + 8.0)
            if chain and until > now:
                placements += [Placement(w, frozenset(chain), until, set()) for w in set(ids)]
        elif op[0] == "event":
            _, worker_id, name = op
            expected.observe(batch(worker_id, Stored(name, 0)))
            for p in placements:
                if p.worker_id == worker_id:
                    p.ended.add(name)
        elif op[0] == "wait":
            now += op[1]
        elif op[0] == "forget":
            expected.forget(op[1])
            placements = [p for p in placements if p.worker_id != op[1]]
        else:
            _, chain, matched = op
            assert expected.extend(matched, chain, now) == model_extend(
                placements, matched, chain, now
            )

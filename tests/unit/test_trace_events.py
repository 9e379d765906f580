"""bench trace's ``+events`` policies: KV events from the simulated workers to a real router
index, arriving when the prefill that computed their blocks ends."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvserve.loadgen.mooncake_trace import SHIPPED
from kvserve.sim.trace.cluster import ClusterResult, ClusterSettings, cluster_replay, split_policy
from kvserve.sim.trace.events import EventFeed, EventTiming
from kvserve.sim.trace.replay import TraceRequest, block_chain, load_trace
from kvserve.sim.trace.workers import SimWorker
from proto.kv_events import MAX_EVENTS
from router.placement.policies import LocalityWeights
from workers.core.block_pool import BlockPool

AT_ADMISSION = EventTiming(at_prefill_end=False)


def worker(pages: int, worker_id: str = "w") -> SimWorker:
    return SimWorker(worker_id, "prefill", BlockPool(pages))


def admit(w: SimWorker, chain: list[int]) -> None:
    w.admit(chain, w.hits(chain))


def test_split_policy() -> None:
    assert split_policy("cache_aware+events") == ("cache_aware", "+events")
    assert split_policy("round_robin+local_hints") == ("round_robin", "+local_hints")
    assert split_policy("least_loaded") == ("least_loaded", "")


def test_stored_events_arrive_when_the_prefill_ends_plus_the_lag() -> None:
    w = worker(8)
    feed = EventFeed([w], EventTiming(lag_s=0.5))
    admit(w, [11, 12])
    feed.publish(w, admitted_at=0.0, prefill_end=2.0)
    feed.deliver(2.49)
    assert feed.matched([11, 12], 2.49) == {}  # the worker is not even known yet
    feed.deliver(2.5)
    assert feed.matched([11, 12, 13], 2.5) == {"w": 2}
    assert AT_ADMISSION.arrival(1.0, 9.0) == 1.0
    with pytest.raises(ValueError, match="lag_s"):
        EventTiming(lag_s=-1.0)


def test_placements_are_expected_until_their_events_arrive() -> None:
    w = worker(8)
    feed = EventFeed([w], EventTiming(lag_s=0.5))
    admit(w, [11, 12])
    feed.placed(["w"], [11, 12], now=0.0, prefill_end=2.0)
    feed.publish(w, admitted_at=0.0, prefill_end=2.0)
    feed.deliver(1.0)
    assert feed.index.position("w") is None
    assert feed.matched([11, 12, 13], 1.0) == {"w": 2}  # from the placement alone
    feed.deliver(2.5)
    assert feed.matched([11, 12, 13], 2.5) == {"w": 2}  # from the index
    w.pool.free_chain([0, 1])
    admit(w, [31, 32, 33, 34, 35, 36, 37, 38])  # evicts 11 and 12
    feed.placed(["w"], [11, 12], now=3.0, prefill_end=3.0)  # no delay: nothing expected
    feed.publish(w, admitted_at=3.0, prefill_end=3.0)
    assert feed.matched([11, 12], 3.0) == {"w": 2}  # the eviction has not arrived
    feed.deliver(3.5)
    assert feed.matched([11, 12], 3.5) == {"w": 0}


def test_a_later_batch_never_overtakes_an_earlier_one() -> None:
    w = worker(8)
    feed = EventFeed([w], EventTiming())
    admit(w, [11])
    feed.publish(w, 0.0, 2.0)
    admit(w, [21])
    feed.publish(w, 1.0, 1.5)  # ends sooner (no such FIFO here), still waits for seq 0
    feed.publish(w, 1.2, 1.7)  # nothing new: no batch
    feed.deliver(1.9)
    assert feed.index.position("w") is None
    feed.deliver(2.0)
    assert feed.index.position("w") == (0.0, 1)
    assert feed.matched([21], 2.0) == {"w": 1}


def test_evictions_flow_too() -> None:
    w = worker(2)
    feed = EventFeed([w], AT_ADMISSION)
    admit(w, [1, 2])
    feed.publish(w, 0.0, 0.0)
    w.pool.free([w.pool.lookup(1) or 0, w.pool.lookup(2) or 0])
    admit(w, [3, 4])  # takes both pages: 1 and 2 are evicted
    feed.publish(w, 1.0, 1.0)
    feed.deliver(1.0)
    assert feed.matched([1, 2], 1.0) == {"w": 0}
    assert feed.matched([3, 4], 1.0) == {"w": 2}
    assert feed.index.blocks("w") == frozenset(w.pool.cached_names()) == {3, 4}


def test_long_admissions_are_split_into_batches() -> None:
    n = MAX_EVENTS + 10
    w = worker(n)
    feed = EventFeed([w], AT_ADMISSION)
    chain = list(range(1, n + 1))
    admit(w, chain)
    feed.publish(w, 0.0, 0.0)
    feed.deliver(0.0)
    assert feed.index.position("w") == (0.0, 1)
    assert feed.matched(chain, 0.0) == {"w": n}


def test_a_fed_worker_must_start_empty() -> None:
    w = worker(4)
    admit(w, [1])
    with pytest.raises(ValueError, match="start empty"):
        EventFeed([w], AT_ADMISSION)


def run(
    trace: list[TraceRequest],
    workers: int,
    capacity: int,
    policy: str,
    model: ClusterSettings | None = None,
) -> ClusterResult:
    chains = [block_chain(r.hash_ids) for r in trace]
    return cluster_replay(trace, chains, workers, capacity, policy, False, model)


@pytest.mark.parametrize(("workers", "capacity"), [(2, 600), (3, 1500)])
def test_events_without_delay_are_the_ideal_hints(workers: int, capacity: int) -> None:
    trace = load_trace(SHIPPED, 250)
    # no slack: placement follows the hints alone, so late ones change it
    model = ClusterSettings(20000.0, weights=LocalityWeights(1.0, 0.0, 1.0))
    ideal = run(trace, workers, capacity, "cache_aware+local_hints", model)
    fed = run(trace, workers, capacity, "cache_aware+events", replace(model, timing=AT_ADMISSION))
    assert fed == ideal
    assert run(trace, workers, capacity, "cache_aware", model) != ideal


ids = st.lists(st.integers(0, 3), min_size=1, max_size=5)


@settings(max_examples=40, deadline=None)
@given(
    lines=st.lists(st.tuples(ids, st.integers(0, 400)), min_size=1, max_size=25),
    workers=st.integers(1, 3),
    capacity=st.integers(2, 16),
)
def test_events_without_delay_equal_ideal_hints_on_any_trace(
    lines: list[tuple[list[int], int]], workers: int, capacity: int
) -> None:
    trace, t = [], 0
    for blocks, gap in lines:
        t += gap
        trace.append(TraceRequest(t, 512 * len(blocks), 3, tuple(blocks)))
    model = ClusterSettings(prefill_tokens_per_s=2000.0, decode_s_per_token=0.2)
    ideal = run(trace, workers, capacity, "cache_aware+local_hints", model)
    fed = replace(model, timing=AT_ADMISSION)
    assert run(trace, workers, capacity, "cache_aware+events", fed) == ideal


def test_decode_goes_where_the_conversation_is_with_hints() -> None:
    # [5] takes decode-0, so [1, 2] decodes on decode-1; 10 s later [1, 2, 3] continues it:
    # without hints both decoders are idle and decode-0 wins (first by id): a miss
    trace = [
        TraceRequest(0, 512, 1, (5,)),
        TraceRequest(1, 1024, 1, (1, 2)),
        TraceRequest(10_000, 1536, 1, (1, 2, 3)),
    ]
    for policy, hit_blocks, per_decoder in [
        ("cache_aware", 0, [2, 1]),
        ("cache_aware+local_hints", 2, [1, 2]),
        ("cache_aware+events", 2, [1, 2]),
    ]:
        result = run(trace, 2, 16, policy)
        assert (result.decode_hits.hit_blocks, result.per_decoder) == (hit_blocks, per_decoder)

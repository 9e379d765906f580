"""Trace replay without a model: parsing, block keys, exact LRU and local-cache hit counts."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from kvpool.keys import KeySpace
from kvserve.loadgen.mooncake_trace import SHIPPED
from kvserve.sim.lru import LeafFirstLRU, LRUCache
from kvserve.sim.trace.cluster import ClusterSettings, cluster_replay
from kvserve.sim.trace.replay import (
    TRACE_HASHER,
    TRACE_NAMESPACE,
    HitCount,
    TraceRequest,
    block_chain,
    load_trace,
    lru_replay,
    parse_trace,
)
from router.placement.policies import LocalityWeights


def req(ids: list[int], tokens: int | None = None, t_ms: int = 0) -> TraceRequest:
    return TraceRequest(t_ms, tokens if tokens is not None else 512 * len(ids), 1, tuple(ids))


def replay(trace: list[TraceRequest], capacity: int) -> HitCount:
    return lru_replay(trace, [block_chain(r.hash_ids) for r in trace], capacity)[0]


# -- parsing -----------------------------------------------------------------------------------


def test_parses_lines_skips_blanks_and_stops_at_max() -> None:
    rows = [
        {"timestamp": 0, "input_length": 1000, "output_length": 1, "hash_ids": [0, 1]},
        {"timestamp": 40, "input_length": 512, "output_length": 1, "hash_ids": [0]},
        {"timestamp": 50, "input_length": 1, "output_length": 1, "hash_ids": [7]},
    ]
    lines = [json.dumps(rows[0]), "", json.dumps(rows[1]) + "\n", json.dumps(rows[2])]
    trace = parse_trace(lines)
    assert trace == [req([0, 1], 1000), req([0], 512, 40), req([7], 1, 50)]
    assert trace[0].block_tokens() == [512, 488]
    assert parse_trace(lines, max_requests=2) == trace[:2]


def test_rejects_block_count_that_does_not_match_length() -> None:
    bad = json.dumps({"timestamp": 0, "input_length": 1025, "hash_ids": [0, 1]})
    with pytest.raises(ValueError, match=r"trace line 2: .*expected ceil"):
        parse_trace(["", bad])
    with pytest.raises(ValueError, match="trace line 1"):
        parse_trace(['{"timestamp": 0}'])


# -- block keys --------------------------------------------------------------------------------


def test_chain_is_the_real_hash_of_one_token_per_block() -> None:
    first = TRACE_HASHER.block(TRACE_HASHER.root(), [5])
    assert block_chain([5, 9]) == [first, TRACE_HASHER.block(first, [9])]
    assert TRACE_HASHER.namespace == TRACE_NAMESPACE


def test_equal_id_prefixes_give_equal_keys_and_only_them() -> None:
    a, b, c = block_chain([1, 2, 3]), block_chain([1, 2, 4]), block_chain([0, 2, 3])
    assert a[:2] == b[:2] and a[2] != b[2]
    assert not set(a) & set(c)  # same ids after a different first block: other prefixes
    keys = KeySpace.of(TRACE_NAMESPACE, 0)
    assert keys.meta_key(a[0]).startswith(keys.tag + "/b/")
    assert keys.block_keys(a[0]) == [keys.meta_key(a[0])]
    with pytest.raises(ValueError, match="4 unsigned bytes"):
        block_chain([1 << 32])


# -- offline LRU -------------------------------------------------------------------------------


def test_lru_counts_leading_hits_exactly() -> None:
    trace = [req([1, 2]), req([1, 2, 3], 1100), req([4]), req([1, 2]), req([1, 2, 3])]
    # capacity 3, LRU -> MRU after each request:
    # [1,2] | [1,2,3] hits 2 | [2,3,4] | [4,1,2] hits 0 (1 evicted) | [1,2,3] hits 2
    count = replay(trace, 3)
    assert (count.requests, count.blocks, count.hit_blocks) == (5, 11, 4)
    assert (count.tokens, count.hit_tokens) == (1024 + 1100 + 512 + 1024 + 1536, 2048)
    assert count.block_hit_rate == 4 / 11
    unbounded = replay(trace, 100)
    assert unbounded.hit_blocks == 2 + 0 + 2 + 3


def test_lru_hits_stop_at_the_first_missing_block() -> None:
    trace = [req([1, 2, 3]), req([1, 2, 3])]
    count = replay(trace, 2)  # block 1 was evicted by 3; 2 and 3 are present but don't count
    assert count.hit_blocks == 0
    assert replay(trace, 3).hit_blocks == 3


def test_lru_partial_last_block_counts_its_tokens() -> None:
    trace = [req([1, 2], 600), req([1, 2], 600), req([1, 2, 3], 1500)]
    count = replay(trace, 10)
    assert count.hit_blocks == 2 + 2
    assert count.hit_tokens == 600 + 1024
    assert count.tokens == 2700


def test_lru_cache_evicts_least_recent_and_counts() -> None:
    cache = LRUCache(2)
    cache.touch([1, 2])
    cache.touch([1, 3])
    assert 1 in cache and 3 in cache and 2 not in cache
    assert (len(cache), cache.evictions) == (2, 1)
    with pytest.raises(ValueError):
        LRUCache(0)


def test_leaf_first_lru_evicts_chain_tails_never_a_prefix_of_a_cached_block() -> None:
    cache = LeafFirstLRU(4)
    cache.touch([1, 2, 3])
    cache.touch([1, 4])  # 1 refreshed, but it has children: the oldest leaf is 3
    cache.touch([5])
    assert [h in cache for h in range(1, 7)] == [True, True, False, True, True, False]
    assert cache.evictions == 1
    cache.touch([6])  # now 2 is a leaf with its old tick: it goes, not 1
    assert [h in cache for h in range(1, 7)] == [True, False, False, True, True, True]
    plain = LRUCache(4)  # the plain LRU drops the root first, stranding its chain
    plain.touch([1, 2, 3])
    plain.touch([7, 8])
    assert 1 not in plain and 2 in plain
    with pytest.raises(ValueError):
        LeafFirstLRU(0)


def test_leaf_first_lru_never_evicts_the_chain_it_is_touching() -> None:
    cache = LeafFirstLRU(2)
    cache.touch([1, 2, 3])  # longer than the capacity: held whole until the next touch
    assert len(cache) == 3
    cache.touch([9])
    assert [h in cache for h in (1, 2, 3, 9)] == [True, False, False, True]  # tail first


def test_leaf_first_replay_hits_at_least_what_the_lru_hits_here() -> None:
    trace = [req([1, 2, 3]), req([4, 5]), req([1, 2, 6]), req([1, 2, 3])]
    chains = [block_chain(r.hash_ids) for r in trace]
    lru, _ = lru_replay(trace, chains, 4)
    leaf, _ = lru_replay(trace, chains, 4, leaf_first=True)
    assert (lru.hit_blocks, leaf.hit_blocks) == (2, 4)


# -- local caches vs shared, under the router's policies ---------------------------------------

ROUND_ROBIN_TRACE = [
    req(ids, t_ms=1000 * i)
    for i, ids in enumerate([[1, 2], [1, 2], [1, 2, 3], [1, 2, 3], [7], [1, 2], [1, 2]])
]


def cluster(
    capacity: int, policy: str, shared: bool, trace: list[TraceRequest], speed: float = 1e12
) -> list[int]:
    chains = [block_chain(r.hash_ids) for r in trace]
    result = cluster_replay(trace, chains, 2, capacity, policy, shared, ClusterSettings(speed))
    assert sum(result.per_worker) == len(trace)
    return [result.hits.hit_blocks, result.hits.blocks, *result.per_worker]


def test_round_robin_local_caches_exact() -> None:
    # 2 workers x 4 pages: w0 gets requests 0,2,4,6 and w1 gets 1,3,5
    assert cluster(8, "round_robin", False, ROUND_ROBIN_TRACE) == [
        0 + 0 + 2 + 2 + 0 + 2 + 2,
        15,
        4,
        3,
    ]
    # 2 pages each: request 2 cannot cache block 3; its pages are freed tail first, so
    # request 4 ([7]) takes w0's page of block 2 and request 6 still hits block 1
    assert cluster(4, "round_robin", False, ROUND_ROBIN_TRACE) == [
        0 + 0 + 2 + 2 + 0 + 2 + 1,
        15,
        4,
        3,
    ]


def test_shared_cache_sees_every_workers_blocks() -> None:
    assert cluster(8, "round_robin", True, ROUND_ROBIN_TRACE) == [
        0 + 2 + 2 + 3 + 0 + 2 + 2,
        15,
        4,
        3,
    ]


def test_local_hints_steer_cache_aware_to_the_worker_that_has_the_prefix() -> None:
    # rendezvous homes (of each prompt's last block): prefill-1 for both [6] and [1, 2].
    # At 1000 tokens/s [6] keeps prefill-1 busy for 0.512 s, so at 0.1 s [1, 2] finds its
    # home 0.412 s busier
    trace = [req([6]), req([1, 2], t_ms=100), req([1, 2], t_ms=5000)]

    def run(policy: str, slack: float) -> list[int]:
        model = ClusterSettings(1000.0, weights=LocalityWeights(1.0, slack, 1.0))
        chains = [block_chain(r.hash_ids) for r in trace]
        result = cluster_replay(trace, chains, 2, 8, policy, False, model)
        return [result.hits.hit_blocks, *result.per_worker]

    # no slack: [1, 2] goes to idle prefill-0; back at 5 s (both idle) it goes home
    # without hints (a miss), to prefill-0 with them
    assert run("cache_aware", 0.0) == [0, 1, 2]
    assert run("cache_aware+local_hints", 0.0) == [2, 2, 1]
    assert run("least_loaded", 0.0) == [0, 2, 1]
    # 0.5 s of slack: home is comparably loaded at 0.1 s, so both go there, hints or not
    assert run("cache_aware", 0.5) == [2, 0, 3]


def test_pages_of_a_running_request_are_held() -> None:
    # slow prefill: request 0 (4 blocks) still runs when request 1 arrives on the same
    # single worker with 4 pages, so request 1 can cache nothing and request 2 misses
    trace = [req([1, 2, 3, 4]), req([5], t_ms=1), req([5], t_ms=10_000)]
    chains = [block_chain(r.hash_ids) for r in trace]
    result = cluster_replay(trace, chains, 1, 4, "round_robin", False, ClusterSettings(1000.0))
    assert result.hits.hit_blocks == 0
    assert result.ttft_s[1] == pytest.approx(2.048 - 0.001 + 0.512)


def test_the_shipped_trace_loads_plain_or_gzipped_alike(tmp_path: Path) -> None:
    """The project ships Mooncake's trace (nothing read from outside the repository); a
    plain copy of it reads the same as the .gz."""
    shipped = load_trace(SHIPPED)
    assert len(shipped) == 3993
    first = shipped[0]
    assert (first.timestamp_ms, first.input_length, first.output_length) == (0, 40160, 6)
    assert first.hash_ids == tuple(range(79))
    plain = tmp_path / "trace.jsonl"
    with gzip.open(SHIPPED, "rt") as f:
        plain.write_text(f.read())
    assert load_trace(plain, 50) == shipped[:50]

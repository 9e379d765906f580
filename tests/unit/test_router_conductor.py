"""The conductor's placement policies, pinned choice by choice."""

from __future__ import annotations

from dataclasses import replace

import pytest

from router.placement.policies import (
    DEFAULT_PREFILL_TOKENS_PER_S,
    HANDOFF_S,
    POOL_FETCH_S_PER_TOKEN,
    CacheAwarePolicy,
    LeastLoadedPolicy,
    Placement,
    PlacementRequest,
    RandomPolicy,
    RoundRobinPolicy,
    WorkerLoad,
    handoff_s,
    make_policy,
    predicted_ttft,
    prefill_locally,
    prefill_remotely,
    remote_ttft,
)

P1 = WorkerLoad("p1", "prefill", queued_prefill_tokens=4000, prefill_tokens_per_s=1000.0)
P2 = WorkerLoad("p2", "prefill", queued_prefill_tokens=500, prefill_tokens_per_s=250.0)
P3 = WorkerLoad("p3", "prefill", queued_prefill_tokens=0, prefill_tokens_per_s=0.0)
D1 = WorkerLoad("d1", "decode", running=3, free_pages=100)
D2 = WorkerLoad("d2", "decode", running=1, free_pages=100)
D3 = WorkerLoad("d3", "decode", running=0, free_pages=40, waiting=2)
M1 = WorkerLoad("m1", "mixed", running=2, free_pages=10, queued_prefill_tokens=10)
M2 = WorkerLoad("m2", "mixed", running=1, free_pages=50, queued_prefill_tokens=99)
LONG = PlacementRequest(prompt_tokens=1000)


def test_predicted_ttft_counts_queue_compute_and_fetch() -> None:
    req = PlacementRequest(prompt_tokens=1000, pooled_tokens=600, local_tokens={"p2": 200})
    # p1: queue 4 s + 400 uncached at 1000/s + 600 fetched
    assert predicted_ttft(req, P1) == pytest.approx(4.0 + 0.4 + 600 * POOL_FETCH_S_PER_TOKEN)
    # p2: queue 2 s + 400 uncached at 250/s + 400 fetched (200 already local)
    assert predicted_ttft(req, P2) == pytest.approx(2.0 + 1.6 + 400 * POOL_FETCH_S_PER_TOKEN)
    # p3 has not measured its speed: the default applies
    expected = 400 / DEFAULT_PREFILL_TOKENS_PER_S + 600 * POOL_FETCH_S_PER_TOKEN
    assert predicted_ttft(req, P3) == pytest.approx(expected)


def test_local_cache_beyond_the_pool_needs_no_fetch() -> None:
    req = PlacementRequest(prompt_tokens=1000, pooled_tokens=100, local_tokens={"p1": 800})
    assert predicted_ttft(req, P1) == pytest.approx(4.0 + 0.2)


def test_cache_aware_picks_lowest_ttft_and_least_loaded_decoder() -> None:
    policy = CacheAwarePolicy(disagg_threshold_tokens=0)
    got = policy.place(LONG, [D1, P1, D2, P2, P3, D3])
    # ttft: p1 5.0 s, p2 6.0 s, p3 0.5 s; decode (no local hints): fewest running +
    # waiting (d2 1, d3 2, d1 3), then most free pages
    assert got == Placement("p3", ("d2", "d3", "d1"))


def test_cache_aware_prefers_the_worker_whose_queue_is_shorter() -> None:
    policy = CacheAwarePolicy()
    assert policy.place(LONG, [P1, P2, D1]) == Placement("p1", ("d1",))  # 5.0 s < 6.0 s
    fast = WorkerLoad("p2", "prefill", queued_prefill_tokens=500, prefill_tokens_per_s=5000.0)
    assert policy.place(LONG, [P1, fast, D1]) == Placement("p2", ("d1",))


def test_conditional_disaggregation_threshold() -> None:
    policy = CacheAwarePolicy(disagg_threshold_tokens=256)
    workers = [P1, P2, D1, D2]
    short = PlacementRequest(prompt_tokens=256)
    assert policy.place(short, workers) == Placement(None, ("d2", "d1"))
    # 257 tokens, idle prefill workers: remote (p3, never measured: 0.1285 s + hand-off
    # 0.0551 s, against 0.1285 s twice over locally)
    long = PlacementRequest(prompt_tokens=257)
    assert policy.place(long, [P3, D1, D2]) == Placement("p3", ("d2", "d1"))
    # p1 4.257 s, p2 3.028 s: backed up, so the decode worker prefills it (0.257 s)
    assert policy.place(long, workers) == Placement(None, ("d2", "d1"))
    # ...never with a threshold of 0 (always disaggregate)
    assert CacheAwarePolicy(disagg_threshold_tokens=0).place(long, workers) == Placement(
        "p2", ("d2", "d1")
    )
    cached = PlacementRequest(prompt_tokens=2000, pooled_tokens=1800)
    assert policy.place(cached, workers) == Placement(None, ("d2", "d1"))


def test_a_short_prompt_goes_remote_only_when_its_first_token_comes_sooner() -> None:
    short = PlacementRequest(prompt_tokens=512, pooled_tokens=448, local_tokens={"d": 448})
    idle_p = WorkerLoad("p", "prefill", prefill_tokens_per_s=1000.0)
    # the decode worker: 64 uncached tokens at 1000/s, nothing queued: 0.064 s
    idle_d = WorkerLoad("d", "decode", prefill_tokens_per_s=1000.0, free_pages=9)
    # remote: 64 tokens + 448 fetched, then 64 handed off
    remote = 0.064 + 448 * POOL_FETCH_S_PER_TOKEN + handoff_s(short, idle_d)
    assert handoff_s(short, idle_d) == pytest.approx(HANDOFF_S + 64 * POOL_FETCH_S_PER_TOKEN)
    assert remote > predicted_ttft(short, idle_d)
    assert not prefill_remotely(short, [idle_p], idle_d)
    policy = CacheAwarePolicy(disagg_threshold_tokens=256)
    assert policy.place(short, [idle_p, idle_d]) == Placement(None, ("d",))
    # a few ms of queue are not worth a hand-off
    nearly_idle = WorkerLoad(
        "d", "decode", prefill_tokens_per_s=1000.0, free_pages=9, queued_prefill_tokens=40
    )
    assert not prefill_remotely(short, [idle_p], nearly_idle)
    # 640 prompt tokens queued on the decode worker (a burst placed there): 0.704 s local
    busy_d = WorkerLoad(
        "d", "decode", prefill_tokens_per_s=1000.0, free_pages=9, queued_prefill_tokens=640
    )
    assert prefill_remotely(short, [idle_p], busy_d)
    assert policy.place(short, [idle_p, busy_d]) == Placement("p", ("d",))
    # the soonest prefill worker decides; the policy then picks (round-robin: in turn)
    busy_p = WorkerLoad("q", "prefill", prefill_tokens_per_s=1000.0, queued_prefill_tokens=9000)
    rr = RoundRobinPolicy(disagg_threshold_tokens=256)
    picks = [rr.place(short, [idle_p, busy_p, busy_d]) for _ in range(3)]
    assert [p.prefill if p else None for p in picks] == ["p", "q", "p"]
    # ...and when every prefill worker is slower, the decode worker keeps it
    assert rr.place(short, [busy_p, busy_d]) == Placement(None, ("d",))


def test_a_long_prompt_goes_local_only_when_the_prefill_workers_are_backed_up() -> None:
    long = PlacementRequest(prompt_tokens=1000)
    decoder = WorkerLoad("d", "decode", prefill_tokens_per_s=1000.0, free_pages=99)
    # idle prefill worker: never, whatever the times
    idle_p = WorkerLoad("p", "prefill", prefill_tokens_per_s=1000.0)
    assert remote_ttft(long, [idle_p], decoder) == pytest.approx(1.0 + handoff_s(long, decoder))
    fast_d = WorkerLoad("d", "decode", prefill_tokens_per_s=10**6, free_pages=99)
    assert not prefill_locally(long, [idle_p], fast_d)
    # 1000 tokens queued there: 2 s, not less than 2 s locally (1 s + 1 s of stall)
    queued = WorkerLoad("p", "prefill", prefill_tokens_per_s=1000.0, queued_prefill_tokens=1000)
    assert not prefill_locally(long, [queued], decoder)
    # 1100 queued: 2.1 s
    backed_up = WorkerLoad("p", "prefill", prefill_tokens_per_s=1000.0, queued_prefill_tokens=1100)
    assert prefill_locally(long, [backed_up], decoder)
    policy = CacheAwarePolicy(disagg_threshold_tokens=256)
    assert policy.place(long, [backed_up, decoder]) == Placement(None, ("d",))
    # ...unless another prefill worker is idle
    idle_q = WorkerLoad("q", "prefill", prefill_tokens_per_s=1000.0)
    assert policy.place(long, [backed_up, decoder, idle_q]) == Placement("q", ("d",))
    # the decode worker's own queue counts: once it holds as much, the prefill worker wins
    busy_d = WorkerLoad(
        "d", "decode", prefill_tokens_per_s=1000.0, free_pages=99, queued_prefill_tokens=1000
    )
    assert policy.place(long, [backed_up, busy_d]) == Placement("p", ("d",))
    # a decode worker without the free pages for the prompt does not take it
    paged = PlacementRequest(prompt_tokens=1000, block_tokens=16)  # 63 pages
    assert prefill_locally(paged, [backed_up], replace(decoder, free_pages=63))
    assert not prefill_locally(paged, [backed_up], replace(decoder, free_pages=62))
    # a threshold of 0 or less always disaggregates
    for threshold in (0, -1):
        always = CacheAwarePolicy(disagg_threshold_tokens=threshold)
        assert always.place(long, [backed_up, decoder]) == Placement("p", ("d",))


def test_no_prefill_worker_means_local_prefill() -> None:
    assert CacheAwarePolicy().place(LONG, [D1, D3]) == Placement(None, ("d3", "d1"))


def test_only_mixed_workers_are_used_alone() -> None:
    policy = CacheAwarePolicy()
    assert policy.place(LONG, [M1, M2, P1]) == Placement(None, ("m2", "m1"))
    assert LeastLoadedPolicy().place(LONG, [M1, M2]) == Placement(None, ("m2", "m1"))


def test_mixed_workers_are_not_used_when_decoders_exist() -> None:
    assert CacheAwarePolicy().place(LONG, [M2, D3]) == Placement(None, ("d3",))


def test_draining_workers_are_skipped_and_nobody_gives_none() -> None:
    drained = WorkerLoad("d9", "decode", draining=True, free_pages=10**6)
    p_drained = WorkerLoad("p0", "prefill", draining=True)
    assert CacheAwarePolicy().place(LONG, [drained, p_drained, P1, D3]) == Placement("p1", ("d3",))
    assert CacheAwarePolicy().place(LONG, [drained, P1]) is None
    assert CacheAwarePolicy().place(LONG, []) is None


def test_least_loaded() -> None:
    policy = LeastLoadedPolicy()
    # prefill: fewest queued tokens; decode: fewest running + waiting, then queued
    assert policy.place(LONG, [P1, P2, P3, D1, D2, D3]) == Placement("p3", ("d2", "d3", "d1"))


def test_round_robin_cycles_in_worker_id_order() -> None:
    policy = RoundRobinPolicy()
    workers = [P2, D2, P1, D1]
    got = [policy.place(LONG, workers) for _ in range(3)]
    assert got == [
        Placement("p1", ("d1", "d2")),
        Placement("p2", ("d2", "d1")),
        Placement("p1", ("d1", "d2")),
    ]


def test_random_is_reproducible_with_a_seed() -> None:
    workers = [P1, P2, P3, D1, D2, D3]
    first = [RandomPolicy(seed=7).place(LONG, workers) for _ in range(2)]
    assert first[0] == first[1]
    seq = RandomPolicy(seed=7)
    runs = [seq.place(LONG, workers) for _ in range(20)]
    assert all(r is not None and sorted(r.decode) == ["d1", "d2", "d3"] for r in runs)
    assert {r.prefill for r in runs if r is not None} == {"p1", "p2", "p3"}


def test_make_policy() -> None:
    assert isinstance(make_policy("cache_aware", 5), CacheAwarePolicy)
    assert make_policy("round_robin", 5).disagg_threshold_tokens == 5
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("nope", 0)

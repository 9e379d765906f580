"""cache_aware's locality scoring (issue 19): overlap against load, rendezvous homes, the
decode worker's local hits in the disaggregation rule, and no herding under a burst."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.placement.pending import PendingLoad
from router.placement.policies import (
    DECODE_OVERLAP_WEIGHT,
    HOME_SLACK,
    OVERLAP_WEIGHT,
    CacheAwarePolicy,
    LeastLoadedPolicy,
    LocalityWeights,
    Placement,
    PlacementRequest,
    Policy,
    WorkerLoad,
    affinity_key,
    predicted_ttft,
    rendezvous,
)

SPEED = 1000.0
A = WorkerLoad("a", "prefill", prefill_tokens_per_s=SPEED)
B = WorkerLoad("b", "prefill", prefill_tokens_per_s=SPEED)
D = WorkerLoad("d", "decode", free_pages=10)
KEY_A, KEY_B = 7, 12345  # rendezvous homes among {a, b}: a for 7, b for 12345
W = LocalityWeights(overlap=1.0, home_slack=0.5, decode_overlap=2.0)


def queued(worker: WorkerLoad, tokens: int) -> WorkerLoad:
    return replace(worker, queued_prefill_tokens=tokens)


def test_defaults_are_the_constants() -> None:
    assert LocalityWeights() == LocalityWeights(OVERLAP_WEIGHT, HOME_SLACK, DECODE_OVERLAP_WEIGHT)
    assert CacheAwarePolicy().weights == LocalityWeights()


def test_affinity_key_is_the_last_block_name() -> None:
    """The whole prompt's name: prompts that share only a system prompt (their first
    blocks) get different keys, so different homes (issue 37)."""
    assert affinity_key([]) is None
    assert affinity_key([11]) == 11
    assert affinity_key([11, 12, 13]) == 13
    assert affinity_key([11, 12, 14]) != affinity_key([11, 12, 13])


def test_rendezvous_is_a_fixed_hash_of_key_and_worker() -> None:
    # pinned: every router process must agree (no per-process hash salt)
    assert rendezvous(7, "a") == 15858009645141378828
    assert rendezvous(7, "b") == 12088238898373856036
    assert rendezvous(12345, "a") < rendezvous(12345, "b")


def test_uncached_on_counts_the_better_of_pool_and_local() -> None:
    req = PlacementRequest(1000, pooled_tokens=300, local_tokens={"d": 700, "e": 100})
    assert (req.uncached_tokens, req.uncached_on("d"), req.uncached_on("e")) == (700, 300, 700)
    assert req.uncached_on("nobody") == 700
    assert PlacementRequest(10, local_tokens={"d": 50}).uncached_on("d") == 0


def test_prefill_cost_is_ttft_minus_weighted_local_prefill() -> None:
    req = PlacementRequest(4000, pooled_tokens=1000, local_tokens={"a": 3000})
    policy = CacheAwarePolicy(weights=W)
    busy_a = queued(A, 2000)
    # a: 2 s queue + 1 s compute - 1.0 * 2 s (the 2000 local tokens the pool lacks);
    # b: 3 s compute + 1000 fetched
    assert policy.prefill_cost(req, busy_a) == pytest.approx(2.0 + 1.0 - 2.0)
    assert policy.prefill_cost(req, B) == pytest.approx(predicted_ttft(req, B))
    assert predicted_ttft(req, B) == pytest.approx(3.0 + 1000 * 2e-5)


def test_without_a_key_the_cheapest_wins_first_by_id() -> None:
    policy = CacheAwarePolicy(weights=W)
    req = PlacementRequest(4000)
    assert policy.pick_prefill(req, [A, B]).worker_id == "a"
    assert policy.pick_prefill(req, [queued(A, 1), B]).worker_id == "b"


def test_a_prefix_cached_nowhere_goes_home_within_the_slack() -> None:
    policy = CacheAwarePolicy(weights=W)
    assert policy.pick_prefill(PlacementRequest(4000, prefix_key=KEY_A), [A, B]).worker_id == "a"
    assert policy.pick_prefill(PlacementRequest(4000, prefix_key=KEY_B), [A, B]).worker_id == "b"
    # the slack is half the request's own prefill (4000 tokens: 4 s): a is 2 s busier,
    # still comparably loaded; 2.001 s: not
    req = PlacementRequest(4000, prefix_key=KEY_A)
    assert policy.pick_prefill(req, [queued(A, 2000), B]).worker_id == "a"
    assert policy.pick_prefill(req, [queued(A, 2001), B]).worker_id == "b"
    short = PlacementRequest(1000, prefix_key=KEY_A)  # a 1 s prefill: 0.5 s of slack
    assert policy.pick_prefill(short, [queued(A, 500), B]).worker_id == "a"
    assert policy.pick_prefill(short, [queued(A, 501), B]).worker_id == "b"


def test_overlap_beats_the_home_and_load_up_to_its_weight() -> None:
    policy = CacheAwarePolicy(weights=replace(W, home_slack=0.0))
    req = PlacementRequest(4000, local_tokens={"b": 1000}, prefix_key=KEY_A)
    # b saves 1 s of compute, worth 1 s more at weight 1: it wins until 2 s busier
    assert policy.pick_prefill(req, [A, queued(B, 2000)]).worker_id == "b"
    assert policy.pick_prefill(req, [A, queued(B, 2001)]).worker_id == "a"
    ttft_greedy = CacheAwarePolicy(weights=LocalityWeights(0.0, 0.0, 0.0))
    assert ttft_greedy.pick_prefill(req, [A, queued(B, 1001)]).worker_id == "a"
    # within the slack, more overlap wins over the home
    slack = CacheAwarePolicy(weights=replace(W, home_slack=5.0))
    assert slack.pick_prefill(req, [queued(A, 0), queued(B, 4000)]).worker_id == "b"


def test_own_tokens_are_what_no_other_candidate_holds() -> None:
    req = PlacementRequest(4000, pooled_tokens=500, local_tokens={"a": 3000, "b": 1000})
    c = WorkerLoad("c", "prefill", prefill_tokens_per_s=SPEED)
    own = CacheAwarePolicy.own_tokens
    assert [own(req, w, [A, B, c]) for w in (A, B, c)] == [2000, 0, 0]
    assert own(req, B, [B, c]) == 500  # alone with c: beyond the pool only
    assert own(req, A) == 2500  # no others given: beyond the pool (prefill_cost's default)
    tie = PlacementRequest(4000, local_tokens={"a": 3000, "b": 3000})
    assert own(tie, A, [A, B]) == own(tie, B, [A, B]) == 0


def test_a_prefix_two_workers_hold_pulls_to_neither() -> None:
    """A short prefix every busy worker holds (a system prompt) does not keep the prompt off
    the worker that lacks it: among comparably loaded candidates the key's home wins, and a
    worker that never held it is not starved (issue 37)."""
    c = WorkerLoad("c", "prefill", prefill_tokens_per_s=SPEED)
    key = next(k for k in range(1000) if max("abc", key=lambda w: rendezvous(k, w)) == "c")
    req = PlacementRequest(4000, local_tokens={"a": 200, "b": 200}, prefix_key=key)
    policy = CacheAwarePolicy(weights=LocalityWeights(4.0, 0.25, 2.0))
    assert policy.pick_prefill(req, [A, B, c]).worker_id == "c"
    held = replace(req, local_tokens={"a": 200})  # a alone holds it: a saves 0.2 s more
    assert policy.pick_prefill(held, [A, B, c]).worker_id == "a"
    deeper = replace(req, local_tokens={"a": 3000, "b": 200})  # a conversation's history
    assert policy.pick_prefill(deeper, [queued(A, 3000), B, c]).worker_id == "a"


def test_with_the_pool_holding_everything_the_conversations_holder_still_wins() -> None:
    """Where the pool holds the whole prompt no candidate's cache saves compute, but the one
    that alone holds a conversation's earlier turns saves their fetch: it wins among the
    comparably loaded; a prefix two of them hold still pulls to neither."""
    c = WorkerLoad("c", "prefill", prefill_tokens_per_s=SPEED)
    key = next(k for k in range(1000) if max("abc", key=lambda w: rendezvous(k, w)) == "c")
    policy = CacheAwarePolicy(weights=LocalityWeights(4.0, 0.25, 2.0))
    turns = PlacementRequest(4000, 4000, {"a": 3000, "b": 200}, prefix_key=key)
    assert CacheAwarePolicy.own_tokens(turns, A, [A, B, c]) == 0
    assert CacheAwarePolicy.own_tokens(turns, A, [A, B, c], beyond_pool=False) == 2800
    assert policy.pick_prefill(turns, [A, B, c]).worker_id == "a"
    shared = replace(turns, local_tokens={"a": 200, "b": 200})
    assert policy.pick_prefill(shared, [A, B, c]).worker_id == "c"


def test_decode_cost_weighs_the_local_share_against_running_requests() -> None:
    policy = CacheAwarePolicy(weights=W)
    d1 = WorkerLoad("d1", "decode", running=3, free_pages=10)
    d2 = WorkerLoad("d2", "decode", running=1, waiting=1, free_pages=50)
    d3 = WorkerLoad("d3", "decode", running=2, free_pages=90)
    req = PlacementRequest(1000, local_tokens={"d1": 750})
    assert policy.decode_cost(req, d1) == pytest.approx(3 - 2.0 * 0.75)
    # d1 1.5, d2 2 (fewer free pages than d3), d3 2
    assert policy.rank_decode(req, [d1, d2, d3]) == [d1, d3, d2]
    assert policy.rank_decode(PlacementRequest(1000), [d1, d2, d3]) == [d3, d2, d1]
    assert policy.decode_cost(PlacementRequest(0), d1) == 3
    # equal costs: the fewer queued prefill tokens first (a mixed worker prefills it), then
    # the more free pages
    m1 = WorkerLoad("m1", "mixed", running=1, queued_prefill_tokens=4000, free_pages=90)
    m2 = WorkerLoad("m2", "mixed", running=1, queued_prefill_tokens=0, free_pages=10)
    m3 = WorkerLoad("m3", "mixed", running=1, queued_prefill_tokens=0, free_pages=20)
    assert policy.rank_decode(PlacementRequest(1000), [m1, m2, m3]) == [m3, m2, m1]


@pytest.mark.parametrize("policy", [CacheAwarePolicy(256), LeastLoadedPolicy(256)])
def test_the_threshold_counts_the_decode_workers_local_hits(policy: Policy) -> None:
    d = WorkerLoad("d", "decode", prefill_tokens_per_s=SPEED)
    busy_p = WorkerLoad("p", "prefill", prefill_tokens_per_s=SPEED, queued_prefill_tokens=10**6)
    # 2000 tokens, none pooled: 100 uncached on d, which holds 1900: d prefills them
    held = PlacementRequest(2000, local_tokens={"d": 1900})
    assert policy.place(held, [busy_p, d]) == Placement(None, ("d",))
    # 2000 uncached on d: a prefill worker does it (an idle one: a backed-up one would
    # leave it to d, :func:`router.placement.types.prefill_locally`)
    idle_p = WorkerLoad("p", "prefill", prefill_tokens_per_s=SPEED)
    assert policy.place(PlacementRequest(2000), [idle_p, d]) == Placement("p", ("d",))


def burst(policy: CacheAwarePolicy, request: PlacementRequest, n: int) -> list[str]:
    """Place ``n`` copies of ``request`` on a, b (and decode d), the pending placements
    added to the loads as the router does between load reports."""
    pending, chosen = PendingLoad(), []
    for _ in range(n):
        loads = pending.apply([A, B, D])
        placement = policy.place(request, loads)
        assert placement is not None and placement.prefill is not None
        pending.placed(placement, request, loads)
        chosen.append(placement.prefill)
    return chosen


def test_a_burst_of_one_prefix_spreads_once_load_outweighs_overlap() -> None:
    policy = CacheAwarePolicy(weights=W)
    req = PlacementRequest(4000, local_tokens={"a": 3000}, prefix_key=KEY_B)
    chosen = burst(policy, req, 50)
    # pending work counts what each worker computes: 1000 tokens (1 s) on a, which holds
    # 3000, 4000 (4 s) on b; a's overlap is worth 3 s + 1.0 * 3 s, so a takes requests
    # until its queue is 6 s (+2 s slack: half the 4 s request) longer than b's, then b
    # takes about one in five
    assert chosen[:10] == ["a"] * 9 + ["b"]
    assert Counter(chosen) == {"a": 41, "b": 9}
    # cached nowhere: home (b) first, then turns as soon as b is 2 s busier
    cold = burst(policy, PlacementRequest(4000, prefix_key=KEY_B), 50)
    assert cold[:4] == ["b", "a", "b", "a"] and Counter(cold) == {"a": 25, "b": 25}


def test_the_default_weights_do_not_herd_a_burst() -> None:
    req = PlacementRequest(4000, local_tokens={"a": 3000}, prefix_key=KEY_B)
    counts = Counter(burst(CacheAwarePolicy(), req, 50))
    # a's queued work (1 s a request) leads b's (4 s a request) by at most what its
    # overlap and the slack are worth, and one request more
    lead_s = (1 + OVERLAP_WEIGHT) * 3.0 + HOME_SLACK * 4.0 + 4.0
    assert counts["b"] > 0 and counts["a"] * 1.0 - counts["b"] * 4.0 <= lead_s


def test_a_prompt_held_whole_costs_its_holder_no_queue() -> None:
    """Pending placements count the tokens the prefilling worker computes: a prompt its
    local cache holds whole (bar the last token) adds almost nothing to its queue."""
    pending = PendingLoad()
    req = PlacementRequest(4000, local_tokens={"a": 3984}, prefix_key=KEY_B)
    placement = Placement("a", ("d",))
    pending.placed(placement, req, [A, B, D])
    loads = {w.worker_id: w for w in pending.apply([A, B, D])}
    assert loads["a"].queued_prefill_tokens == 16
    assert loads["d"].waiting == 1


loads = st.lists(st.integers(0, 20_000), min_size=1, max_size=5)


@settings(max_examples=200, deadline=None)
@given(
    queues=loads,
    local=st.lists(st.integers(0, 8000), min_size=5, max_size=5),
    key=st.one_of(st.none(), st.integers(0, 2**64)),
    overlap=st.sampled_from([0.0, 0.5, 1.0, 4.0]),
    slack=st.sampled_from([0.0, 0.25, 1.0]),
)
def test_the_choice_is_within_the_slack_of_the_cheapest(
    queues: list[int], local: list[int], key: int | None, overlap: float, slack: float
) -> None:
    workers = [queued(replace(A, worker_id=f"p{i}"), q) for i, q in enumerate(queues)]
    req = PlacementRequest(8000, local_tokens={f"p{i}": t for i, t in enumerate(local)})
    req = replace(req, prefix_key=key)
    policy = CacheAwarePolicy(weights=LocalityWeights(overlap, slack, 0.0))
    chosen = policy.pick_prefill(req, workers)
    costs = [policy.prefill_cost(req, w, workers) for w in workers]
    bar = slack * 8000 / SPEED if key is not None else 0.0  # in prefills of the request
    assert policy.prefill_cost(req, chosen) <= min(costs) + bar
    if key is None:
        assert chosen is workers[costs.index(min(costs))]
    if overlap == 0.0 and slack == 0.0 and key is None:  # the TTFT-greedy choice
        assert chosen is min(workers, key=lambda w: predicted_ttft(req, w))


@settings(max_examples=100, deadline=None)
@given(key=st.integers(0, 2**64), n=st.integers(2, 6), gone=st.integers(0, 5))
def test_a_cold_prefix_keeps_its_home_when_another_worker_leaves(
    key: int, n: int, gone: int
) -> None:
    workers = [replace(A, worker_id=f"p{i}") for i in range(n)]
    policy = CacheAwarePolicy(weights=W)
    req = PlacementRequest(4000, prefix_key=key)
    home = policy.pick_prefill(req, workers)
    assert home.worker_id == max((w.worker_id for w in workers), key=lambda w: rendezvous(key, w))
    rest = [w for w in workers if w.worker_id != f"p{gone % n}"]
    if home in rest:
        assert policy.pick_prefill(req, rest) is home

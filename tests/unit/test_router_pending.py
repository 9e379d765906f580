"""The router's own placements count until the workers' next reports."""

from __future__ import annotations

from dataclasses import replace

from router.placement.pending import PendingLoad
from router.placement.policies import CacheAwarePolicy, Placement, PlacementRequest, WorkerLoad

P1 = WorkerLoad("p1", "prefill", queued_prefill_tokens=100, report_at=1.0)
P2 = WorkerLoad("p2", "prefill", queued_prefill_tokens=300, report_at=1.0)
D1 = WorkerLoad("d1", "decode", waiting=1, report_at=1.0)
LOADS = [P1, P2, D1]


def test_placements_add_until_a_newer_report() -> None:
    pending = PendingLoad()
    request = PlacementRequest(prompt_tokens=1000, pooled_tokens=200)
    pending.placed(Placement("p1", ("d1",)), request, LOADS)
    pending.placed(Placement("p1", ("d1",)), request, LOADS)
    p1, p2, d1 = pending.apply(LOADS)
    assert (p1.queued_prefill_tokens, p1.waiting) == (100 + 2 * 800, 0)
    assert p2 == P2 and (d1.queued_prefill_tokens, d1.waiting) == (0, 3)
    fresh = [replace(P1, report_at=2.0), P2, D1]  # p1 reported again: it counts them itself
    assert pending.apply(fresh)[0] == fresh[0]
    assert pending.apply(LOADS)[0] == P1  # and the old extras are gone for good


def test_a_local_prefill_queues_on_the_decode_worker() -> None:
    pending = PendingLoad()
    pending.placed(Placement(None, ("d1",)), PlacementRequest(prompt_tokens=64), LOADS)
    (d1,) = pending.apply([D1])
    assert (d1.queued_prefill_tokens, d1.waiting) == (64, 2)


def test_cache_aware_spreads_a_burst_between_reports() -> None:
    policy, pending = CacheAwarePolicy(0), PendingLoad()
    loads = [replace(P1, queued_prefill_tokens=0), replace(P2, queued_prefill_tokens=0), D1]
    chosen = []
    for _ in range(4):
        request = PlacementRequest(prompt_tokens=4000)
        seen = pending.apply(loads)
        placement = policy.place(request, seen)
        assert placement is not None
        pending.placed(placement, request, seen)
        chosen.append(placement.prefill)
    assert chosen == ["p1", "p2", "p1", "p2"]  # without pending: p1 four times

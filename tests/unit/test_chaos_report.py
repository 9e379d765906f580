"""The chaos command's pure parts: its workload and how outcomes become the table's figures."""

from __future__ import annotations

from kvserve.chaos.load import OUTPUT_LENGTHS, Outcome, workload
from kvserve.chaos.report import FaultRecord, summarize


def test_workload_is_seeded_shares_prefixes_and_alternates_streaming() -> None:
    a, b = workload(40, seed=3, vocab=1000), workload(40, seed=3, vocab=1000)
    assert a == b and a != workload(40, seed=4, vocab=1000)
    assert {r.stream for r in a[::2]} == {False} and {r.stream for r in a[1::2]} == {True}
    assert {r.max_tokens for r in a} <= set(OUTPUT_LENGTHS)
    heads = {r.prompt[:64] for r in a}
    assert len(heads) <= 8 < len(a)
    assert all(72 <= len(r.prompt) <= 144 and max(r.prompt) < 1000 for r in a)


def test_summarize_counts_every_outcome_against_the_reference() -> None:
    outcomes = [
        Outcome("ok", "abc"),
        Outcome("ok", "abX"),  # wrong tokens
        Outcome("error", detail="HTTP 503"),
        Outcome("error", detail="HTTP 503"),
        Outcome("hung"),
        None,  # never sent (time ran out)
    ]
    refs = ["abc", "abc", "x", "y", "z", "w"]
    records = [
        FaultRecord("kill-decode", "decode-0", 1.0, 3.0, 20.0),
        FaultRecord("kill-decode", "decode-1", 9.0, 5.0, None),
        FaultRecord("kill-redis", "redis", 30.0),
    ]
    s = summarize(outcomes, refs, migrated=2, leaked={"d0": 0, "d1": 3, "p0": -1}, records=records)
    assert s["requests"] == 5 and s["succeeded"] == 2 and s["migrated"] == 2
    assert s["failed_with_clear_error"] == 2 and s["errors"] == {"HTTP 503": 2}
    assert s["hung"] == 1 and s["wrong_tokens"] == 1 and s["pages_leaked"] == 4
    assert s["exact_after_fp_tie"] == 0
    assert s["mismatches"] == [
        {
            "index": 1,
            "exact_after_fp_tie": False,
            "response_id": "",
            "diverges_at_char": 2,
            "got": "abX",
            "expected": "abc",
        }
    ]
    tied = summarize(outcomes, refs, 2, {}, records, ties=frozenset({1}))
    assert tied["wrong_tokens"] == 0 and tied["exact_after_fp_tie"] == 1
    assert s["faults"] == {
        "kill-decode": {
            "count": 2,
            "detection": "median 4.00 s, max 5.00 s (2)",
            "recovery": "median 20.00 s, max 20.00 s (1)",
        },
        "kill-redis": {"count": 1, "detection": "-", "recovery": "-"},
    }


def test_faults_come_in_turn_or_at_random() -> None:
    import random

    from kvserve.chaos.inject import next_fault

    faults = ["kill-master", "kill-prefill", "kill-decode"]
    rng = random.Random(0)
    assert [next_fault(faults, "cycle", rng, i) for i in range(4)] == [*faults, "kill-master"]
    picked = {next_fault(faults, "random", random.Random(s), 0) for s in range(20)}
    assert picked == set(faults)


def test_requests_cut_with_a_killed_router_are_counted_apart() -> None:
    """Lost: failed as a cut connection does, on a router a kill-router fault killed. A cut
    on a router nobody killed, or a clear error from a killed one, is a failure."""
    killed, other = "127.0.0.1:8001", "127.0.0.1:8002"
    outcomes: list[Outcome | None] = [
        Outcome("error", detail="APIConnectionError", upstream=killed),
        Outcome("error", detail="HTTP 502: Bad Gateway", upstream=killed),
        Outcome("error", detail="APIConnectionError", upstream=other),
        Outcome("error", detail="HTTP 503: no worker", upstream=killed),
        Outcome("ok", "a", upstream=killed),
    ]
    records = [FaultRecord("kill-router", "router-0", 1.0, 0.1, 2.0, address=killed)]
    s = summarize(outcomes, ["", "", "", "", "a"], 0, {}, records)
    assert s["lost_with_their_router"] == 2
    assert s["failed_with_clear_error"] == 2
    assert s["errors"] == {"APIConnectionError": 1, "HTTP 503: no worker": 1}
    assert s["succeeded"] == 1


def test_the_upstream_is_the_last_router_the_balancer_tried() -> None:
    from kvserve.chaos.load import upstream_of

    assert upstream_of({"x-kvserve-upstream": "127.0.0.1:1, 127.0.0.1:2"}) == "127.0.0.1:2"
    assert upstream_of({"x-kvserve-upstream": "127.0.0.1:1"}) == "127.0.0.1:1"
    assert upstream_of({}) == ""

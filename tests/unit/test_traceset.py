"""A trace set in one ``bench trace`` run: naming and loading traces, the worst point over
traces x workers x capacities and the rule that chooses weights by it (exactly), the
session policies it compares, and the command's JSON."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest

from kvserve.bench.trace import run as trace
from kvserve.bench.trace.traces import MOONCAKE, TRACE_SET, load_traces, trace_names
from kvserve.loadgen.mooncake_trace import SHIPPED
from kvserve.settings import add_config_args
from kvserve.sim.trace.cluster import ClusterSettings, cluster_replay
from kvserve.sim.trace.policies import HomeSpillPolicy, SessionAffinityPolicy, session_key
from kvserve.sim.trace.replay import TraceRequest, block_chain
from kvserve.sim.trace.sweep import choose, policy_worst, swept_pairs, worst_point
from router.placement.policies import LocalityWeights, PlacementRequest, WorkerLoad, rendezvous

# -- naming and loading ----------------------------------------------------------------------


def test_set_expands_once_in_order() -> None:
    assert TRACE_SET == ("mooncake", "chat", "conv-short", "conv-long", "agent")
    assert trace_names(["agent", "set", "x.jsonl"]) == [
        "agent",
        "mooncake",
        "chat",
        "conv-short",
        "conv-long",
        "x.jsonl",
    ]
    assert trace_names([]) == []


def test_load_names_generated_shipped_and_the_single_trace_fallback() -> None:
    traces = load_traces(["agent", MOONCAKE], SHIPPED, 20, 0, 0.03)
    assert [t.name for t in traces] == ["agent", "mooncake"]
    assert all(len(t.requests) == len(t.chains) == 20 for t in traces)
    assert traces[0].chains[0] == block_chain(traces[0].requests[0].hash_ids)
    assert traces[0].source["seed"] == 0 and traces[1].source == {"path": str(SHIPPED)}
    (alone,) = load_traces([], SHIPPED, 5, 0, 0.03)  # no --traces: --trace, as before
    assert alone.name == "mooncake" and len(alone.requests) == 5
    with pytest.raises(FileNotFoundError, match=r"nowhere\.jsonl"):
        load_traces(["nowhere.jsonl"], SHIPPED, 5, 0, 0.03)


# -- worst point and choice --------------------------------------------------------------------


def row(name: str, cap: int, n: int, local_vs_shared: float | None, p90: float) -> dict[str, Any]:
    return {
        "trace": name,
        "capacity_blocks": cap,
        "workers": n,
        "local_vs_shared_tokens": local_vs_shared,
        "model_ttft_s_p90_local": p90,
    }


BASE = {("a", 10, 2): 1.0, ("a", 10, 4): 0.5, ("b", 10, 2): 2.0, ("b", 10, 4): 0.0}


def test_worst_point_is_the_minimum_and_maximum_over_every_point() -> None:
    rows = [
        row("a", 10, 2, 0.99, 1.0),
        row("a", 10, 4, 0.96, 0.52),  # p90 1.04 of the baseline's
        row("b", 10, 2, 0.94, 1.0),
        row("b", 10, 4, None, 0.3),  # shared hit nothing; baseline p90 0: both left out
    ]
    assert worst_point(rows, BASE) == {
        "min_local_vs_shared": 0.94,
        "min_at": {"trace": "b", "capacity_blocks": 10, "workers": 2},
        "max_p90_vs_baseline": 1.04,
        "max_p90_at": {"trace": "a", "capacity_blocks": 10, "workers": 4},
        "points": 4,
        "points_at_target": 2,
        "points_within_ttft_target": 2,
        "meets_targets": False,
    }
    good = worst_point([row("a", 10, 2, 0.95, 1.02)], BASE)
    assert good["meets_targets"] and good["points_within_ttft_target"] == 1
    empty = worst_point([row("b", 10, 4, None, 0.3)], BASE)
    assert empty["min_at"] is None and empty["max_p90_vs_baseline"] is None
    assert empty["meets_targets"]


def summary(low: float, p90: float, name: str) -> dict[str, Any]:
    return {
        "name": name,
        "min_local_vs_shared": low,
        "max_p90_vs_baseline": p90,
        "meets_targets": low >= 0.95 and p90 <= 1.02,
    }


def test_choice_prefers_both_targets_then_ttft_then_the_worst_ratio() -> None:
    a, b = summary(0.99, 1.03, "a"), summary(0.96, 1.01, "b")
    c, d = summary(0.97, 1.0, "c"), summary(0.90, 0.9, "d")
    assert choose([a, b, c, d]) is c  # both met: the larger worst ratio
    assert choose([a, d]) is d  # only d keeps TTFT: worst ratio 0.90 beats 0.99 at 1.03
    e, f = summary(0.93, 1.01, "e"), summary(0.93, 1.0, "f")
    assert choose([e, f]) is f  # equal worst ratio: the lower worst p90
    assert choose([a, summary(0.99, 1.05, "g")]) is a
    assert choose([]) is None


def test_policy_worst_compares_each_policy_with_round_robin() -> None:
    rows = [
        {"section": "cluster", "policy": "round_robin", **row("a", 10, 2, 0.5, 1.0)},
        {"section": "cluster", "policy": "x", **row("a", 10, 2, 0.97, 1.1)},
        {"section": "capacity", "policy": "x"},
    ]
    worst = policy_worst(rows)
    assert [(w["policy"], w["max_p90_vs_baseline"]) for w in worst] == [
        ("round_robin", 1.0),
        ("x", 1.1),
    ]
    assert policy_worst(rows[1:]) == []  # no baseline, no comparison


def test_only_cache_aware_sweeps_the_overlap_weight() -> None:
    grid = [(4.0, 1.0), (8.0, 1.0), (8.0, 2.0)]
    assert swept_pairs("cache_aware+events", grid) == grid
    default = LocalityWeights().overlap
    assert swept_pairs("home_spill+events", grid) == [(default, 1.0), (default, 2.0)]


# -- session policies ------------------------------------------------------------------------

SPEED = 1000.0
WORKERS = [WorkerLoad(f"p{i}", "prefill", prefill_tokens_per_s=SPEED) for i in range(4)]


def by_weight(key: int) -> list[str]:
    return sorted((w.worker_id for w in WORKERS), key=lambda w: rendezvous(key, w), reverse=True)


def test_session_affinity_ignores_load_home_spill_spills_in_home_order() -> None:
    order = by_weight(5)
    loads = [
        WorkerLoad(
            w.worker_id,
            "prefill",
            prefill_tokens_per_s=SPEED,
            queued_prefill_tokens=3000 if w.worker_id == order[0] else 0,
        )
        for w in WORKERS
    ]
    req = PlacementRequest(1000, prefix_key=5)  # a 1 s prefill; the home 3 s busier
    sticky = SessionAffinityPolicy(weights=LocalityWeights(8.0, 2.0, 2.0))
    assert sticky.pick_prefill(req, loads).worker_id == order[0]
    spill = HomeSpillPolicy(weights=LocalityWeights(8.0, 2.0, 2.0))
    assert spill.pick_prefill(req, loads).worker_id == order[1]  # 3 s > 2 prefills: spill
    loose = HomeSpillPolicy(weights=LocalityWeights(8.0, 3.0, 2.0))
    assert loose.pick_prefill(req, loads).worker_id == order[0]  # 3 s within 3 prefills


def test_session_key_is_the_session_else_the_first_block() -> None:
    chain = block_chain([1, 2])
    assert session_key(TraceRequest(0, 1024, 1, (1, 2), 7), chain) == 7
    assert session_key(TraceRequest(0, 1024, 1, (1, 2)), chain) == chain[0]
    assert session_key(TraceRequest(0, 1024, 1, (1, 2)), []) is None


def test_a_sticky_session_stays_on_one_worker() -> None:
    reqs = [TraceRequest(100 * i, 512 * (i + 1), 1, tuple(range(i + 1)), 3) for i in range(4)]
    chains = [block_chain(r.hash_ids) for r in reqs]
    result = cluster_replay(reqs, chains, 3, 30, "session_affinity", False, ClusterSettings())
    assert sorted(result.per_worker) == [0, 0, 4]
    assert result.hits.hit_blocks == 0 + 1 + 2 + 3


# -- the command -----------------------------------------------------------------------------


def test_a_trace_set_run_prints_its_rows_and_the_sweeps_choice(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = argparse.ArgumentParser()
    add_config_args(parser, trace.TraceBenchConfig)
    flags = (
        "--traces mooncake agent --max-requests 30 --no-pool --capacities 300 --workers 2 "
        "--policies round_robin cache_aware+events --sweep-overlap-weights 8 "
        "--sweep-home-slacks 1 1.5"
    )
    assert trace.run(parser.parse_args(flags.split())) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["conditions"]["traces"]) == {"mooncake", "agent"}
    assert out["conditions"]["requests"] == 60
    sections = [r["section"] for r in out["results"]]
    assert sections == (
        ["ceiling", "capacity"] * 2
        + ["cluster"] * 4
        + ["policy_worst"] * 2
        + (["sweep"] * 2 + ["sweep_summary"]) * 2
        + ["sweep_choice"]
    )
    assert {r["trace"] for r in out["results"] if r["section"] == "sweep"} == {"mooncake", "agent"}
    assert out["headline"]["locality"]["policy"] == "cache_aware+events"

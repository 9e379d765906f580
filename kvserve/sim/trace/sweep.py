"""The sweep that measures the locality weights over a trace set (``kvserve bench trace
--sweep-...``), and the worst-point rule that chooses them. Pure.

The weights (:class:`router.placement.policies.LocalityWeights`) are chosen from this sweep, not
guessed. For each policy swept (``--sweep-policies``, by default :data:`SWEEP_POLICY`) and
each pair (``overlap``, ``home_slack``) of the grid (``overlap`` only where the policy uses
it: ``cache_aware``), the policy is replayed on every trace at every point (capacity,
workers): its local hits against one shared cache under the same policy, and its modelled
TTFT p90 against :data:`BASELINE`'s local replay at the same point (section ``sweep``).
One ``sweep_summary`` row per pair gives its :func:`worst_point`, and one ``sweep_choice``
row per policy the pair :func:`choose` keeps: by the worst point over every trace, worker
count and capacity, never a mean. The decode weight is swept apart (section
``decode_sweep``): decode placement changes no prefill hit, so each value runs at the
default prefill weights, and its rows give the decode workers' local hits and spread.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from kvserve.sim.trace.cluster import ClusterSettings, cluster_replay, split_policy
from kvserve.sim.trace.replay import Trace
from router.placement.policies import LocalityWeights

SWEEP_POLICY = "cache_aware+events"
"""The policy whose weights the sweep chooses by default (the live router's)."""
TARGET = 0.95
"""Local hits over shared hits the weights are chosen to reach at every point."""
TTFT_TARGET = 1.02
"""The most a point's modelled TTFT p90 may be over :data:`BASELINE`'s."""
BASELINE = "round_robin"
"""The policy whose TTFT p90 each point is compared with."""

Point = tuple[str, int, int]
"""(trace, capacity in blocks, workers)."""


def ratio(value: float, baseline: float) -> float | None:
    """``value / baseline`` to 4 places, None when the baseline is 0."""
    return round(value / baseline, 4) if baseline else None


def point_of(row: Mapping[str, Any]) -> Point:
    """The point of a ``cluster`` or ``sweep`` row."""
    return (row["trace"], row["capacity_blocks"], row["workers"])


def _at(point: Point) -> dict[str, Any]:
    return dict(zip(("trace", "capacity_blocks", "workers"), point, strict=True))


def worst_point(
    rows: Sequence[Mapping[str, Any]], baseline_p90: Mapping[Point, float]
) -> dict[str, Any]:
    """The worst of ``rows`` (one policy and weights, one row per point): the smallest
    ``local_vs_shared_tokens`` (a point whose shared cache hit nothing has None there and
    is left out: nothing to keep) and the largest ratio of ``model_ttft_s_p90_local`` to
    ``baseline_p90`` at the same point (left out where that is 0), each with where it
    falls (None when no point counts); how many points reach :data:`TARGET` and
    :data:`TTFT_TARGET`, and ``meets_targets``: whether every point reaches both."""
    hits = [(r["local_vs_shared_tokens"], point_of(r)) for r in rows]
    hits = [(v, p) for v, p in hits if v is not None]
    ttft = [
        (ratio(r["model_ttft_s_p90_local"], baseline_p90[point_of(r)]), point_of(r)) for r in rows
    ]
    slow = [(v, p) for v, p in ttft if v is not None]
    low, high = min(hits, default=None), max(slow, default=None)
    at_target = sum(1 for v, _ in hits if v >= TARGET)
    within = sum(1 for v, _ in slow if v <= TTFT_TARGET)
    return {
        "min_local_vs_shared": low[0] if low else None,
        "min_at": _at(low[1]) if low else None,
        "max_p90_vs_baseline": high[0] if high else None,
        "max_p90_at": _at(high[1]) if high else None,
        "points": len(rows),
        "points_at_target": at_target,
        "points_within_ttft_target": within,
        "meets_targets": at_target == len(hits) and within == len(slow),
    }


def choose(summaries: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The summary (:func:`worst_point`) whose worst point is best: one that meets both
    targets everywhere, else one whose TTFT p90 is within :data:`TTFT_TARGET` everywhere;
    among those, the largest smallest local/shared, then the smallest largest p90 ratio;
    the first on ties. None for no summary."""

    def rank(s: Mapping[str, Any]) -> tuple[bool, bool, float, float]:
        p90 = s["max_p90_vs_baseline"]
        within = p90 is None or p90 <= TTFT_TARGET
        low = s["min_local_vs_shared"]
        return (s["meets_targets"], within, 1.0 if low is None else low, -(p90 or 0.0))

    return max(summaries, key=rank, default=None)


def baseline_p90(rows: Sequence[Mapping[str, Any]]) -> dict[Point, float]:
    """The :data:`BASELINE` policy's local TTFT p90 at each point of ``cluster`` rows."""
    return {point_of(r): r["model_ttft_s_p90_local"] for r in rows if r.get("policy") == BASELINE}


def policy_worst(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Section ``policy_worst``: per policy of the ``cluster`` rows, its :func:`worst_point`
    against :data:`BASELINE`'s rows (none without them)."""
    cluster = [r for r in rows if r["section"] == "cluster"]
    base = baseline_p90(cluster)
    if not base:
        return []
    policies = list(dict.fromkeys(r["policy"] for r in cluster))
    return [
        {
            "section": "policy_worst",
            "policy": policy,
            **worst_point([r for r in cluster if r["policy"] == policy], base),
        }
        for policy in policies
    ]


def sweep_rows(
    traces: Sequence[Trace],
    points: Sequence[tuple[int, int]],
    policies: Sequence[str],
    grid: Sequence[tuple[float, float]],
    decode_weights: Sequence[float],
    settings: ClusterSettings,
) -> list[dict[str, Any]]:
    """Rows of the sweep (module docstring) over ``traces`` and ``points`` (capacity,
    workers), the swept ``policies``, the prefill weight pairs of ``grid`` and the
    ``decode_weights``; ``settings`` give the model (their ``weights`` are replaced)."""
    rows: list[dict[str, Any]] = []
    base = (
        {
            (t.name, c, w): _replay(t, c, w, BASELINE, False, settings).ttft_quantiles()[1]
            for t in traces
            for c, w in points
        }
        if grid
        else {}
    )
    default = LocalityWeights()
    shared: dict[tuple[str, float, Point], float] = {}
    for policy in policies:
        summaries = []
        for overlap, slack in swept_pairs(policy, grid):
            weights = LocalityWeights(overlap, slack, default.decode_overlap)
            run = replace(settings, weights=weights)
            pair = [_sweep_row(t, c, w, policy, run, shared) for t in traces for c, w in points]
            summary = {
                "section": "sweep_summary",
                "policy": policy,
                "overlap": overlap,
                "home_slack": slack,
                **worst_point(pair, base),
            }
            rows += [*pair, summary]
            summaries.append(summary)
        chosen = choose(summaries)
        if chosen is not None:
            rows.append({**chosen, "section": "sweep_choice"})
    for weight in decode_weights:
        run = replace(settings, weights=replace(default, decode_overlap=weight))
        for t in traces:
            for c, w in points:
                local = _replay(t, c, w, SWEEP_POLICY, False, run)
                row = _row("decode_sweep", t.name, c, w, decode_overlap=weight)
                rows.append({**row, **local.row("_local")})
    return rows


def swept_pairs(policy: str, grid: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """``grid``, or for a policy without an overlap weight its slacks alone (at the
    default overlap, which it ignores)."""
    if split_policy(policy)[0] == "cache_aware":
        return list(grid)
    slacks = dict.fromkeys(slack for _, slack in grid)
    return [(LocalityWeights().overlap, slack) for slack in slacks]


def _replay(
    trace: Trace, capacity: int, workers: int, policy: str, shared: bool, run: ClusterSettings
) -> Any:
    return cluster_replay(trace.requests, trace.chains, workers, capacity, policy, shared, run)


def _sweep_row(
    trace: Trace,
    capacity: int,
    workers: int,
    policy: str,
    run: ClusterSettings,
    shared_rates: dict[tuple[str, float, Point], float],
) -> dict[str, Any]:
    """One ``sweep`` row. A shared replay gets no local hints, so it does not depend on
    ``overlap``: it runs once per policy, ``home_slack`` and point (``shared_rates``)."""
    assert run.weights is not None
    local = _replay(trace, capacity, workers, policy, False, run)
    key = (policy, run.weights.home_slack, (trace.name, capacity, workers))
    if key not in shared_rates:
        result = _replay(trace, capacity, workers, policy, True, run)
        shared_rates[key] = result.hits.token_hit_rate
    shared = shared_rates[key]
    row = _row(
        "sweep",
        trace.name,
        capacity,
        workers,
        overlap=run.weights.overlap,
        home_slack=run.weights.home_slack,
    )
    row["policy"] = policy
    row.update(local.row("_local"))
    row["token_hit_rate_shared"] = round(shared, 4)
    row["local_vs_shared_tokens"] = ratio(local.hits.token_hit_rate, shared)
    return row


def _row(section: str, trace: str, capacity: int, workers: int, **weights: float) -> dict[str, Any]:
    return {
        "section": section,
        **weights,
        "trace": trace,
        "capacity_blocks": capacity,
        "workers": workers,
    }

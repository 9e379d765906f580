"""The sweep that measures ``cache_aware``'s locality weights (``kvserve bench trace
--sweep-...``). Pure.

The weights (:class:`router.conductor.LocalityWeights`) are chosen from this sweep, not
guessed: for each pair of prefill weights (``overlap``, ``home_slack``), the policy
``cache_aware+events`` is replayed at every capacity and worker count, and its local hits
compared with one shared cache under the same policy (:func:`sweep_rows`, section
``sweep``, and one ``sweep_summary`` row per pair: the smallest ratio, how many points reach
:data:`TARGET`, the largest TTFT p90). The decode weight is swept apart (section
``decode_sweep``): decode placement changes no prefill hit, so each value runs at the
default prefill weights, and its rows give the decode workers' local hits and their spread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from kvserve.bench.tracecluster import EVENTS_SUFFIX, ClusterSettings, cluster_replay
from kvserve.bench.tracesim import TraceRequest
from router.conductor import LocalityWeights

SWEEP_POLICY = "cache_aware" + EVENTS_SUFFIX
TARGET = 0.95
"""Local hits over shared hits the weights are chosen to reach (issue 19)."""


def ratio(value: float, baseline: float) -> float | None:
    """``value / baseline`` to 4 places, None when the baseline is 0."""
    return round(value / baseline, 4) if baseline else None


def sweep_rows(
    requests: Sequence[TraceRequest],
    chains: Sequence[Sequence[int]],
    points: Sequence[tuple[int, int]],
    grid: Sequence[tuple[float, float]],
    decode_weights: Sequence[float],
    settings: ClusterSettings,
) -> list[dict[str, Any]]:
    """Rows of the sweep (module docstring) over ``points`` (capacity, workers), the
    prefill weight pairs of ``grid`` and the ``decode_weights``; ``settings`` give the
    model (their ``weights`` are replaced). A shared replay does not depend on
    ``overlap`` (no local hints), so it runs once per ``home_slack`` and point."""
    rows: list[dict[str, Any]] = []
    shared: dict[tuple[float, int, int], float] = {}
    default = LocalityWeights()
    for overlap, slack in grid:
        run = replace(settings, weights=LocalityWeights(overlap, slack, default.decode_overlap))
        pair: list[dict[str, Any]] = []
        for capacity, workers in points:
            if (slack, capacity, workers) not in shared:
                result = cluster_replay(
                    requests, chains, workers, capacity, SWEEP_POLICY, True, run
                )
                shared[slack, capacity, workers] = result.hits.token_hit_rate
            local = cluster_replay(requests, chains, workers, capacity, SWEEP_POLICY, False, run)
            row = _row("sweep", capacity, workers, overlap=overlap, home_slack=slack)
            row.update(local.row("_local"))
            base = shared[slack, capacity, workers]
            row["token_hit_rate_shared"] = round(base, 4)
            row["local_vs_shared_tokens"] = ratio(local.hits.token_hit_rate, base)
            pair.append(row)
        rows += pair
        rows.append(_summary(overlap, slack, pair))
    for weight in decode_weights:
        weights = LocalityWeights(default.overlap, default.home_slack, weight)
        run = replace(settings, weights=weights)
        for capacity, workers in points:
            local = cluster_replay(requests, chains, workers, capacity, SWEEP_POLICY, False, run)
            row = _row("decode_sweep", capacity, workers, decode_overlap=weight)
            row.update(local.row("_local"))
            rows.append(row)
    return rows


def _row(section: str, capacity: int, workers: int, **weights: float) -> dict[str, Any]:
    return {"section": section, **weights, "capacity_blocks": capacity, "workers": workers}


def _summary(overlap: float, slack: float, pair: list[dict[str, Any]]) -> dict[str, Any]:
    ratios = [r["local_vs_shared_tokens"] or 0.0 for r in pair]
    return {
        "section": "sweep_summary",
        "overlap": overlap,
        "home_slack": slack,
        "min_local_vs_shared": min(ratios),
        "points_at_target": sum(1 for r in ratios if r >= TARGET),
        "points": len(ratios),
        "max_model_ttft_s_p90": max(r["model_ttft_s_p90_local"] for r in pair),
    }

"""The traces ``kvserve bench trace`` replays in one run (``--traces``), and the rows measured
on them: sections ``ceiling`` and ``capacity`` (:func:`capacity_rows`) and ``cluster``
(:func:`cluster_row`).

A trace is named: ``mooncake`` (the shipped synthetic Mooncake trace,
:data:`~kvserve.loadgen.mooncake_trace.SHIPPED`), a generated shape of
:data:`~kvserve.sim.trace.gen.SHAPES` (``chat``, ``conv-short``, ``conv-long``, ``agent``: drawn
from the run's seed), or a Mooncake-format file's path. ``set`` names the default trace
set, :data:`TRACE_SET`. Without ``--traces`` the run replays ``--trace`` alone, as before.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvserve.bench.trace.pool import PoolReplaySettings, pool_replay
from kvserve.loadgen.mooncake_trace import SHIPPED
from kvserve.report import log
from kvserve.sim.trace.cluster import ClusterSettings, cluster_replay
from kvserve.sim.trace.gen import SHAPES, session_trace
from kvserve.sim.trace.replay import Trace, block_chain, load_trace, lru_replay
from kvserve.sim.trace.sweep import ratio

MOONCAKE = "mooncake"
"""The name of the shipped trace."""
SET = "set"
"""The name that stands for :data:`TRACE_SET`."""
TRACE_SET = (MOONCAKE, *SHAPES)
"""The default trace set: the shipped trace and every generated shape."""
UNBOUNDED = 1 << 62
"""The capacity of the LRU that gives a trace's ceiling."""
POOL_ROWS = {"master": "pool", "chain": "pool_chain"}
"""The row key of each eviction's real-pool replay."""


def trace_names(names: Sequence[str]) -> list[str]:
    """``names`` with :data:`SET` expanded to :data:`TRACE_SET`, each name once, in order."""
    expanded = (TRACE_SET if name == SET else (name,) for name in names)
    return list(dict.fromkeys(one for group in expanded for one in group))


def load_traces(
    names: Sequence[str],
    fallback: Path,
    max_requests: int,
    seed: int,
    answer_s_per_token: float,
) -> list[Trace]:
    """The traces of ``names`` (:func:`trace_names`; empty: the file ``fallback`` alone),
    each cut to its first ``max_requests`` requests (0: all); generated ones are drawn from
    ``seed``, their answers taking ``answer_s_per_token`` per token. ``FileNotFoundError``
    for a name that is neither a trace nor a file."""
    out = []
    for name in trace_names(names) or [MOONCAKE if fallback == SHIPPED else str(fallback)]:
        source: dict[str, Any]
        if name in SHAPES:
            requests = session_trace(SHAPES[name], seed, answer_s_per_token)
            source = {"generated": dataclasses.asdict(SHAPES[name]), "seed": seed}
            requests = requests[:max_requests] if max_requests else requests
        else:
            path = SHIPPED if name == MOONCAKE else Path(name)
            if not path.is_file():
                raise FileNotFoundError(f"trace {name}: neither {TRACE_SET} nor a file")
            requests = load_trace(path, max_requests or None)
            source = {"path": str(path)}
        out.append(Trace(name, requests, [block_chain(r.hash_ids) for r in requests], source))
    return out


def cluster_row(
    trace: Trace, capacity: int, workers: int, policy: str, model: ClusterSettings
) -> dict[str, Any]:
    """``policy`` on ``workers`` local caches of ``capacity // workers`` blocks against one
    shared cache of ``capacity`` (:func:`~kvserve.sim.trace.cluster.cluster_replay`)."""
    local, shared = (
        cluster_replay(trace.requests, trace.chains, workers, capacity, policy, s, model)
        for s in (False, True)
    )
    return {
        "section": "cluster",
        "trace": trace.name,
        "capacity_blocks": capacity,
        "workers": workers,
        "local_blocks_per_worker": capacity // workers,
        "policy": policy,
        "local_vs_shared_tokens": ratio(local.hits.token_hit_rate, shared.hits.token_hit_rate),
        **local.row("_local"),
        **{k: v for k, v in shared.row("_shared").items() if "decode" not in k},
    }


def capacity_rows(
    trace: Trace, capacities: Sequence[int], replays: Sequence[PoolReplaySettings]
) -> list[dict[str, Any]]:
    """Sections ``ceiling`` and ``capacity`` of ``trace``: its unbounded LRU, then per
    capacity the offline LRU, the leaf-first LRU and one real-pool replay per settings of
    ``replays`` (none: no pool)."""
    requests, chains = trace.requests, trace.chains
    ceiling, _ = lru_replay(requests, chains, UNBOUNDED)
    rows: list[dict[str, Any]] = [{"section": "ceiling", "trace": trace.name, "lru": ceiling.row()}]
    for capacity in capacities:
        lru, _ = lru_replay(requests, chains, capacity)
        leaf, _ = lru_replay(requests, chains, capacity, leaf_first=True)
        row: dict[str, Any] = {"section": "capacity", "trace": trace.name}
        row |= {"capacity_blocks": capacity, "lru": lru.row(), "leaf_lru": leaf.row()}
        row["leaf_lru_vs_lru_tokens"] = ratio(leaf.token_hit_rate, lru.token_hit_rate)
        for settings in replays:
            replay = pool_replay(requests, chains, capacity, settings, Path(tempfile.gettempdir()))
            name = POOL_ROWS[settings.eviction]
            row[name] = replay.row(settings)
            row[f"{name}_vs_lru_tokens"] = ratio(replay.hits.token_hit_rate, lru.token_hit_rate)
        log(f"capacity {capacity}: {row}")
        rows.append(row)
    return rows

"""``kvserve bench trace``: prefix hit rates of a Mooncake-format trace, without a model.

1. Read the trace (``--trace``), or the traces of ``--traces`` (a trace set:
   :mod:`kvserve.bench.trace.traces`, generated shapes :mod:`kvserve.sim.trace.gen`), at most
   ``--max-requests`` each, and name every block in the pool's key space
   (:func:`kvserve.sim.trace.replay.block_chain`). Every step below runs on each trace.
2. Per capacity (``--capacities``, in blocks): an offline exact LRU replay (the baseline),
   an offline leaf-first LRU (evicting only chain tails) and, unless ``--no-pool``, replays
   through a real ``mooncake_master`` holding that many blocks, once per ``--evictions``:
   ``master`` (its own eviction) and ``chain`` (kvserve's chain-aware eviction through a
   real Redis; :mod:`kvserve.bench.trace.pool`). Also one unbounded LRU replay: the trace's
   own ceiling.
3. Per capacity C, worker count N (``--workers``) and router policy (``--policies``): N
   prefill workers with local caches of C/N blocks against one shared cache of C blocks,
   requests placed by ``router.placement.policies`` (:mod:`kvserve.sim.trace.cluster`), each also
   decoded on one of N decode workers with local caches of C/N blocks; then per policy its
   worst point over every trace and point against ``round_robin`` (``policy_worst``).
4. With ``--sweep-overlap-weights`` and ``--sweep-home-slacks`` (and/or
   ``--sweep-decode-weights``): the sweep that measures ``cache_aware``'s locality weights
   (:mod:`kvserve.sim.trace.sweep`) over the same traces, capacities and worker counts,
   choosing by the worst point.
5. Print one JSON object; with ``--out``, also PNG plots (:mod:`.plot`).

Headline: the real pool's token hit rate over the offline LRU's, the lowest over every
capacity, with chain-aware eviction (the master's eviction when ``chain`` is not replayed).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from kvpool.config import EVICTION
from kvserve.bench.common import ratio_headline
from kvserve.bench.trace.pool import PoolReplaySettings
from kvserve.bench.trace.traces import capacity_rows, cluster_row, load_traces
from kvserve.loadgen.mooncake_trace import SHIPPED
from kvserve.report import emit, log
from kvserve.settings import BENCH_ENV, setting
from kvserve.sim.trace.cluster import EVENTS_SUFFIX, HINT_SUFFIX, ClusterSettings
from kvserve.sim.trace.events import EventTiming
from kvserve.sim.trace.policies import SESSION_POLICIES
from kvserve.sim.trace.replay import BLOCK_TOKENS, Trace
from kvserve.sim.trace.sweep import SWEEP_POLICY, policy_worst, sweep_rows

POLICIES = (
    *("random", "round_robin", "least_loaded"),
    *("cache_aware" + suffix for suffix in ("", HINT_SUFFIX, EVENTS_SUFFIX)),
)
"""The policies replayed by default."""
ALL_POLICIES = (
    *POLICIES,
    *(name + suffix for name in SESSION_POLICIES for suffix in ("", EVENTS_SUFFIX)),
)
"""Every policy ``--policies`` and ``--sweep-policies`` take: also the session policies of
:mod:`kvserve.sim.trace.policies` (``+events``: with the same hints as ``cache_aware``)."""


@dataclass(frozen=True)
class TraceBenchConfig:
    """The trace, pool and cluster of ``kvserve bench trace``.

    - ``trace``: Mooncake-format JSON lines, plain or .gz (default: the shipped Mooncake
      trace), replayed when ``traces`` is empty;
    - ``traces``: the traces to replay, each named ``mooncake``, a generated shape
      (``chat``, ``conv-short``, ``conv-long``, ``agent``), a file, or ``set`` for all of
      ``mooncake chat conv-short conv-long agent`` (:mod:`kvserve.bench.trace.traces`);
    - ``max_requests``: requests replayed of each trace (0: all);
    - ``capacities``: cache capacities, in blocks;
    - ``block_bytes``: bytes of each pool object of a block;
    - ``layers``: layer objects per block besides its meta object;
    - ``eviction_high_watermark``: the pool's eviction high watermark;
    - ``eviction_ratio``: the share the pool evicts at once;
    - ``put_retries``: per failed put batch;
    - ``evictions``: who evicts in the real-pool replays: ``master`` (mooncake_master's
      own eviction) and/or ``chain`` (kvserve's chain-aware eviction);
    - ``evict_at``: the share of the segment chain eviction's budget is (the segment is
      sized so that the budget is the capacity);
    - ``pool``: replay on a real pool (--no-pool: skip the real-pool replays);
    - ``workers``: worker counts of the cluster replay;
    - ``policies``: router policies of the cluster replay;
    - ``prefill_tokens_per_s``: modelled prefill speed of each worker (queue model of the
      cluster replay); the default lets 2 workers keep up with the trace's ~60k prompt
      tokens/s;
    - ``decode_s_per_token``: modelled decode time of each output token (a request holds
      its decode worker's pages that long per output token after its prefill);
    - ``event_lag_s``: seconds a ``+events`` policy's KV events take to reach the router's
      index after the prefill that computed their blocks ends;
    - ``sweep_overlap_weights`` / ``sweep_home_slacks``: the grid of ``cache_aware``'s
      prefill weights to sweep (both needed; empty: no sweep);
    - ``sweep_policies``: the policies whose weights are swept (``overlap`` applies to
      ``cache_aware`` only, ``home_slack`` to every one: home_spill's spill threshold);
    - ``sweep_decode_weights``: ``cache_aware``'s decode weights to sweep (empty: none);
    - ``ssd_fraction``: also replay DRAM only against DRAM + SSD on a DRAM tier that holds
      this share of the working set (:mod:`kvserve.bench.trace.ssd`, whose puts retry
      at least through two offload heartbeats, whatever ``put_retries`` says; 0: not run);
    - ``seed``: seed of the random policy and of the generated traces;
    - ``out``: folder for PNG plots.
    """

    env_prefix: ClassVar[str] = BENCH_ENV
    trace: Path = SHIPPED
    traces: list[str] = setting([])
    max_requests: int = 0
    capacities: list[int] = setting([1000, 4000, 16000])
    block_bytes: int = PoolReplaySettings.block_bytes
    layers: int = PoolReplaySettings.layers
    eviction_high_watermark: float = PoolReplaySettings.eviction_high_watermark
    eviction_ratio: float = PoolReplaySettings.eviction_ratio
    put_retries: int = PoolReplaySettings.put_retries
    evictions: list[str] = setting(list(EVICTION), choices=EVICTION)
    evict_at: float = PoolReplaySettings.evict_at
    pool: bool = True
    workers: list[int] = setting([2, 4])
    policies: list[str] = setting(list(POLICIES), choices=ALL_POLICIES)
    prefill_tokens_per_s: float = ClusterSettings.prefill_tokens_per_s
    decode_s_per_token: float = ClusterSettings.decode_s_per_token
    event_lag_s: float = 0.0
    sweep_overlap_weights: list[float] = setting([])
    sweep_home_slacks: list[float] = setting([])
    sweep_policies: list[str] = setting([SWEEP_POLICY], choices=ALL_POLICIES)
    sweep_decode_weights: list[float] = setting([])
    ssd_fraction: float = 0.0
    seed: int = 0
    out: Path | None = None


SETTINGS = (TraceBenchConfig,)
"""The flags of ``kvserve bench trace``."""


def _validate(args: argparse.Namespace) -> None:
    if min(args.capacities) < 1 or min(args.workers) < 1 or args.max_requests < 0:
        raise ValueError("capacities and workers must be positive, max-requests >= 0")
    if args.prefill_tokens_per_s <= 0 or args.decode_s_per_token < 0 or args.event_lag_s < 0:
        raise ValueError("prefill-tokens-per-s must be positive, decode and lag times >= 0")
    if bool(args.sweep_overlap_weights) != bool(args.sweep_home_slacks):
        raise ValueError("sweep-overlap-weights and sweep-home-slacks go together")


def run(args: argparse.Namespace) -> int:
    """Run the benchmark described by ``args`` (the flags of :data:`SETTINGS`); returns 0.
    ``FileNotFoundError`` for a trace that is neither a name nor a file."""
    _validate(args)
    traces = load_traces(
        args.traces, args.trace, args.max_requests, args.seed, args.decode_s_per_token
    )
    capacities = sorted(set(args.capacities))
    replays = [_pool_settings(args, eviction) for eviction in args.evictions] if args.pool else []
    rows: list[dict[str, Any]] = []
    for trace in traces:
        log(f"trace {trace.name}: {len(trace.requests)} requests")
        rows += capacity_rows(trace, capacities, replays)
    lru = {(r["trace"], r["capacity_blocks"]): r["lru"] for r in rows if r["section"] == "capacity"}
    model = ClusterSettings(
        prefill_tokens_per_s=args.prefill_tokens_per_s,
        decode_s_per_token=args.decode_s_per_token,
        seed=args.seed,
        timing=EventTiming(at_prefill_end=True, lag_s=args.event_lag_s),
    )
    points = list(itertools.product(capacities, sorted(set(args.workers))))
    for trace, (capacity, workers), policy in itertools.product(traces, points, args.policies):
        rows.append(cluster_row(trace, capacity, workers, policy, model))
        rows[-1]["lru_token_hit_rate"] = lru[trace.name, capacity]["token_hit_rate"]
        log(f"cluster: {rows[-1]}")
    rows += policy_worst(rows)
    grid = list(itertools.product(args.sweep_overlap_weights, args.sweep_home_slacks))
    if grid or args.sweep_decode_weights:
        rows += sweep_rows(
            traces, points, args.sweep_policies, grid, args.sweep_decode_weights, model
        )
    headline = _headline(rows)
    if args.ssd_fraction:
        from kvserve.bench.trace.ssd import ssd_headline, ssd_rows

        logs = Path(tempfile.gettempdir())
        rows += ssd_rows(traces[0], args.ssd_fraction, _pool_settings(args), logs)
        headline = ssd_headline(rows)
    emit("trace", _conditions(args, traces, capacities), rows, headline)
    if args.out is not None:
        from kvserve.bench.trace.plot import plot

        plot(rows, args.out)
    return 0


def _pool_settings(args: argparse.Namespace, eviction: str = "master") -> PoolReplaySettings:
    """The settings of a real-pool replay with ``eviction``, the rest from the flags."""
    fields = [f.name for f in dataclasses.fields(PoolReplaySettings) if f.name != "eviction"]
    return PoolReplaySettings(eviction=eviction, **{name: getattr(args, name) for name in fields})


def _conditions(
    args: argparse.Namespace, traces: list[Trace], capacities: list[int]
) -> dict[str, Any]:
    def flags(*names: str) -> dict[str, Any]:
        return {name: getattr(args, name) for name in names}

    return {
        "requests": sum(len(t.requests) for t in traces),
        "traces": {t.name: {"requests": len(t.requests), **t.source} for t in traces},
        "max_requests": args.max_requests,
        "capacities_blocks": capacities,
        "block_tokens": BLOCK_TOKENS,
        "block_bytes": args.block_bytes,
        "objects_per_block": 1 + args.layers,
        "real_pool": args.pool,
        "evictions": args.evictions if args.pool else [],
        "chain_eviction": "kvpool.chain_index through a real Redis: a block's hits refresh "
        "it, new blocks are claimed before they are put, least recently used chain tails "
        "evicted beyond a budget of capacity blocks; segment = budget / evict_at",
        **flags("evict_at", "eviction_high_watermark", "eviction_ratio", "put_retries"),
        "workers": sorted(set(args.workers)),
        **flags("policies", "prefill_tokens_per_s", "decode_s_per_token", "event_lag_s"),
        **flags("seed", "sweep_policies", "ssd_fraction"),
        "repetitions": 1,
        "keys": "PrefixHasher.block(parent, [trace hash id]) chained from the unsalted root "
        "(sha256, fixed public key), namespace mooncake-trace/none/bt512; KeySpace meta key "
        "(+ layer keys) per block",
        "hits": "leading blocks present before the request; partial last block counted "
        "with its tokens",
        "cluster_model": "FIFO per prefill worker at prefill_tokens_per_s over uncached "
        "tokens; pages held until prefill ends; local caches = BlockPool(C // N), shared = "
        "one BlockPool(C); N decode workers with BlockPool(C // N) each, holding a prompt's "
        "pages until output_length * decode_s_per_token after its prefill; placement by "
        "router.placement.policies, every request to a prefill worker; +events: hints from a "
        "PrefixIndex fed by the workers' KV events, each request's arriving when its "
        "prefill ends + event_lag_s",
    }


def _headline(rows: list[dict[str, Any]]) -> dict[str, Any]:
    caps = [r for r in rows if r["section"] == "capacity"]
    name = next((n for n in ("pool_chain", "pool") if caps and n in caps[0]), None)
    if name is None:
        worst, value = max(caps, key=lambda r: r["capacity_blocks"]), None
    else:
        worst = min(caps, key=lambda r: r[f"{name}_vs_lru_tokens"] or 0.0)
        value = worst[name]["token_hit_rate"]
    locality = [r for r in rows if r["section"] == "policy_worst" and r["policy"] == SWEEP_POLICY]
    return ratio_headline(
        "real-pool prefix hit rate (tokens) / offline LRU of the same capacity, the lowest "
        "over the capacities",
        value,
        worst["lru"]["token_hit_rate"],
        1.0,
        4,
        pool=name,
        capacity_blocks=worst["capacity_blocks"],
        locality=locality[0] if locality else None,
    )

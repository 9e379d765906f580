"""Prefill workers with local prefix caches against one shared cache, under the router's
real placement policies, replayed over a trace without running any model. Pure.

Each worker's cache is the engine's own :class:`~workers.core.block_pool.BlockPool` (refcounts,
LRU free list, hash index; :class:`~kvserve.sim.trace.workers.SimWorker`); placement is
:mod:`router.placement.policies`'s policies (``pick_prefill`` and ``rank_decode``: every request
to a prefill worker) with the loads of a simple queue model (see :func:`cluster_replay`),
or a session policy of :mod:`kvserve.sim.trace.policies`. Block hashes and hit
semantics are those of :mod:`kvserve.sim.trace.replay`.

A policy name may carry a suffix saying where the policy's local-cache hints
(``PlacementRequest.local_tokens``) come from: :data:`HINT_SUFFIX`, the caches themselves
(ideal hints: always right, never late); :data:`EVENTS_SUFFIX`, a real router index fed by
the workers' KV events, late as in the live system (:mod:`kvserve.sim.trace.events`).
Without a suffix the policy has no hints.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kvserve.sim.trace.events import EventFeed, EventTiming
from kvserve.sim.trace.policies import SESSION_POLICIES, SessionPolicy, session_key
from kvserve.sim.trace.replay import HitCount, TraceRequest
from kvserve.sim.trace.workers import SimWorker
from router.placement.policies import (
    CacheAwarePolicy,
    LocalityWeights,
    PlacementRequest,
    Policy,
    affinity_key,
    make_policy,
)
from workers.core.block_pool import BlockPool

HINT_SUFFIX = "+local_hints"
"""Policy-name suffix: the policy sees each worker's local leading hits exactly."""
EVENTS_SUFFIX = "+events"
"""Policy-name suffix: the policy sees the local leading hits a
:class:`router.placement.prefix_index.PrefixIndex` fed by the workers' KV events reports."""


def split_policy(name: str) -> tuple[str, str]:
    """``(policy, hint suffix)`` of a policy name; the suffix is ``""`` when there is none."""
    for suffix in (HINT_SUFFIX, EVENTS_SUFFIX):
        if name.endswith(suffix):
            return name.removesuffix(suffix), suffix
    return name, ""


@dataclass(frozen=True)
class ClusterSettings:
    """The replay's model: ``prefill_tokens_per_s`` of each prefill worker,
    ``decode_s_per_token`` (each output token's decode time, so a request holds its decode
    worker's pages until ``output_length`` of them after its prefill ended), ``seed`` of
    the random policy, ``timing`` of the KV events (``+events``), and ``weights``: the
    ``cache_aware`` policy's (None: its defaults)."""

    prefill_tokens_per_s: float = 50000.0
    decode_s_per_token: float = 0.03
    seed: int = 0
    timing: EventTiming = field(default_factory=EventTiming)
    weights: LocalityWeights | None = None

    def policy(self, name: str) -> Policy:
        """The policy ``name`` (no suffix): a conductor policy, or one of
        :data:`~kvserve.sim.trace.policies.SESSION_POLICIES` (with ``weights``, as
        ``cache_aware``)."""
        if name in SESSION_POLICIES:
            return SESSION_POLICIES[name](disagg_threshold_tokens=-1, weights=self.weights)
        if name == "cache_aware" and self.weights is not None:
            return CacheAwarePolicy(disagg_threshold_tokens=-1, weights=self.weights)
        return make_policy(name, disagg_threshold_tokens=-1, seed=self.seed)


@dataclass
class ClusterResult:
    """Prefill hits, per-prefill-worker request counts and the modelled TTFTs of one
    cluster replay; the decode workers' local hits, request counts and peak concurrency."""

    hits: HitCount
    per_worker: list[int]
    ttft_s: list[float]
    decode_hits: HitCount = field(default_factory=HitCount)
    per_decoder: list[int] = field(default_factory=list)
    peak_decoding: list[int] = field(default_factory=list)

    def ttft_quantiles(self) -> tuple[float, float]:
        """Modelled TTFT median and 90th percentile (``statistics.quantiles``, exclusive
        method; a single request is both), in seconds."""
        if len(self.ttft_s) < 2:
            return (self.ttft_s[0], self.ttft_s[0]) if self.ttft_s else (0.0, 0.0)
        return statistics.median(self.ttft_s), statistics.quantiles(self.ttft_s, n=10)[-1]

    def row(self, suffix: str) -> dict[str, Any]:
        """The replay's figures, each key ending in ``suffix`` (``_local``, ``_shared``)."""
        p50, p90 = self.ttft_quantiles()
        return {
            f"token_hit_rate{suffix}": round(self.hits.token_hit_rate, 4),
            f"block_hit_rate{suffix}": round(self.hits.block_hit_rate, 4),
            f"requests_per_worker{suffix}": self.per_worker,
            f"model_ttft_s_p50{suffix}": round(p50, 4),
            f"model_ttft_s_p90{suffix}": round(p90, 4),
            f"model_ttft_s_mean{suffix}": round(statistics.fmean(self.ttft_s or [0.0]), 4),
            f"decode_token_hit_rate{suffix}": round(self.decode_hits.token_hit_rate, 4),
            f"requests_per_decoder{suffix}": self.per_decoder,
            f"peak_decoding_per_decoder{suffix}": self.peak_decoding,
        }


def cluster_replay(
    requests: Sequence[TraceRequest],
    chains: Sequence[Sequence[int]],
    workers: int,
    capacity: int,
    policy: str,
    shared: bool,
    settings: ClusterSettings | None = None,
) -> ClusterResult:
    """Place each request on one of ``workers`` prefill workers and one of ``workers``
    decode workers with the router's real ``policy`` (optionally suffixed, module
    docstring) and replay it there.

    ``shared=False``: each prefill worker owns a :class:`BlockPool` of ``capacity //
    workers`` pages (its local prefix cache). ``shared=True``: all prefill workers use one
    pool of ``capacity`` pages (a global cache; its hits are the pool's ``pooled_tokens``)
    and the policy gets no local hints. Each decode worker owns ``capacity // workers``
    pages either way; a request's decode hits are the leading blocks its decode worker
    held (its KV need not come from the pool), then it caches the prompt there.

    Queue model (no model runs): a prefill worker prefills one request at a time at
    ``prefill_tokens_per_s``, only the uncached tokens; a request starts when it arrives
    (trace timestamp) or when its worker is free, and holds its pages (refcount) until its
    prefill ends, then frees them in chain order, so they stay cached as LRU. Its decode
    worker holds the prompt's pages from arrival until ``output_length *
    decode_s_per_token`` after the prefill ends. The loads the policy sees are those at
    arrival time; the request's ``prefix_key`` is :func:`router.placement.policies.affinity_key`
    of its chain (for a session policy, its :func:`~.policies.session_key`).
    """
    settings = settings or ClusterSettings()
    base, hints = split_policy(policy)
    conductor = settings.policy(base)
    by_session = isinstance(conductor, SessionPolicy)
    speed = settings.prefill_tokens_per_s
    common = BlockPool(capacity) if shared else None
    local_pages = max(1, capacity // workers)
    prefillers = [
        SimWorker(f"prefill-{i}", "prefill", common or BlockPool(local_pages))
        for i in range(workers)
    ]
    decoders = [SimWorker(f"decode-{i}", "decode", BlockPool(local_pages)) for i in range(workers)]
    sims = prefillers + decoders
    hinted = bool(hints) and not shared
    feed = EventFeed(sims, settings.timing) if hinted and hints == EVENTS_SUFFIX else None
    result = ClusterResult(HitCount(), [], [])
    for request, chain in zip(requests, chains, strict=True):
        now = request.timestamp_ms / 1000.0
        for w in sims:
            w.release(now)
        tokens = list(itertools.accumulate(request.block_tokens(), initial=0))
        local: dict[str, int] = {}
        if feed is not None:
            feed.deliver(now)
            local = {wid: tokens[n] for wid, n in feed.matched(chain, now).items()}
        elif hinted:
            local = {w.worker_id: tokens[w.hits(chain)] for w in sims}
        placement_request = PlacementRequest(
            prompt_tokens=request.input_length,
            pooled_tokens=tokens[prefillers[0].hits(chain)] if shared else 0,
            local_tokens=local,
            prefix_key=session_key(request, chain) if by_session else affinity_key(chain),
        )
        prefiller, decoder = _place(conductor, placement_request, sims, now, speed)
        hits = prefiller.hits(chain)
        result.hits.add(request, hits)
        pages = prefiller.admit(chain, hits)
        start = max(now, prefiller.busy_until)
        prefiller.busy_until = start + (request.input_length - tokens[hits]) / speed
        prefiller.hold(pages, prefiller.busy_until, now)
        result.ttft_s.append(prefiller.busy_until - now)
        decode_hits = decoder.hits(chain)
        result.decode_hits.add(request, decode_hits)
        done = prefiller.busy_until + request.output_length * settings.decode_s_per_token
        decoder.hold(decoder.admit(chain, decode_hits), done, now)
        if feed is not None:
            feed.placed((prefiller.worker_id, decoder.worker_id), chain, now, prefiller.busy_until)
            feed.publish(prefiller, now, prefiller.busy_until)
            feed.publish(decoder, now, prefiller.busy_until)
    result.per_worker = [w.requests for w in prefillers]
    result.per_decoder = [w.requests for w in decoders]
    result.peak_decoding = [w.peak_running for w in decoders]
    return result


def _place(
    policy: Policy, request: PlacementRequest, sims: Sequence[SimWorker], now: float, speed: float
) -> tuple[SimWorker, SimWorker]:
    """The prefill and decode workers ``policy`` chooses for ``request`` among ``sims`` at
    ``now``: its own :meth:`~router.placement.policies.Policy.pick_prefill` and the first of its
    :meth:`~router.placement.policies.Policy.rank_decode`, each over its role's workers sorted by id
    (every request to a prefill worker, whatever rule 4 of ``Policy.place`` would say)."""
    by_id = {w.worker_id: w for w in sims}
    loads = sorted((w.load(now, speed) for w in sims), key=lambda w: w.worker_id)
    prefill = policy.pick_prefill(request, [w for w in loads if w.role == "prefill"])
    decode = policy.rank_decode(request, [w for w in loads if w.role == "decode"])[0]
    return by_id[prefill.worker_id], by_id[decode.worker_id]

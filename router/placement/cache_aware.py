"""The cache-aware policy: placement by locality weighed against load (:class:`CacheAwarePolicy`,
its weights :class:`LocalityWeights`, and a prompt's home among equals: :func:`affinity_key`,
:func:`rendezvous`). Pure: no I/O. Its contract is :class:`router.placement.policy.Policy`'s.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from router.placement.policy import Policy
from router.placement.types import PlacementRequest, WorkerLoad, predicted_ttft

OVERLAP_WEIGHT = 4.0
"""Seconds of prefill queue that one second of prefill saved by a worker's local cache
(beyond the pool and the other candidates) outweighs, over what it saves the request
itself (:meth:`CacheAwarePolicy.prefill_cost`). Measured with :data:`HOME_SLACK` over a
trace set (the command and whole table in docs/benchmarks.md, section 4.3):
``cache_aware+events`` on the Mooncake trace and generated chats, long chats and tool
agents, at 2, 4 and 8 workers and 4k, 10k, 30k blocks, chosen by the worst point
(:func:`kvserve.sim.trace.sweep.choose`): local hits at least 0.95 of a shared pool's and
TTFT p90 within 2% of round_robin's at every point, then the largest worst ratio, over the
set and Mooncake's published conversation trace together: 4 (worst 0.951 there, 0.956 on
the set; 0.959 on both with the second key of :meth:`CacheAwarePolicy.pick_prefill`); 2
is best on the set alone but keeps 0.939 on that trace, 8 herds tool agents onto their
system prompts' holders (0.905, TTFT p90 1.66x round_robin's)."""

HOME_SLACK = 0.25
"""How far above the cheapest a candidate's prefill cost may be and still count as
comparably loaded (so the one with most local overlap, then the prompt's rendezvous home,
is preferred), in units of the request's own prefill time on the cheapest candidate
(``prompt_tokens / prefill_speed``): a share of the request, so the same value holds on
any hardware and model (measured with :data:`OVERLAP_WEIGHT`)."""

DECODE_OVERLAP_WEIGHT = 2.0
"""Running requests that a decode worker holding a whole prompt locally outweighs
(:meth:`CacheAwarePolicy.decode_cost`). Measured in two parts (docs/benchmarks.md, section
4). The simulator (``kvserve bench trace --sweep-decode-weights 2 4 8 16``) measures the
locality side: the decode workers' local hits grow with the weight up to 8 (weight 2 keeps
80-90% of them), but it decodes any number of requests at the same speed, so it cannot
see the load side. The live run (``kvserve bench compare --workload conversation``,
SmolLM2, 2 mixed workers, one run each) does: weight 8 piled conversations on their
holders (TTFT p50 / p90 2.21 / 9.24 s, 39% of prompt tokens computed, against
least_loaded's 2.08 / 6.19 s and 33%), weight 2 did not (1.61 / 6.55 s, 29% computed)."""


def affinity_key(chain: Sequence[int]) -> int | None:
    """A prompt's :attr:`PlacementRequest.prefix_key`: the name of the last block of its
    chain of block names (:mod:`kvpool.hashing`), naming the whole prompt up to there; None
    without a full block. Not a leading block, which a system prompt or a template makes
    alike in nearly every prompt, sending all cold prompts to one home; a prefix
    seen before is found by the local hints (``local_tokens``), not by the key."""
    return chain[-1] if chain else None


def rendezvous(key: int, worker_id: str) -> int:
    """The rendezvous (highest random weight) weight of ``worker_id`` for ``key``: a stable
    64-bit hash of both (the same in every process). The candidate of highest weight is a
    prefix's home; removing another worker does not move it."""
    digest = hashlib.blake2b(f"{key}/{worker_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


@dataclass(frozen=True)
class LocalityWeights:
    """How :class:`CacheAwarePolicy` weighs local-cache overlap against load
    (defaults: :data:`OVERLAP_WEIGHT`, :data:`HOME_SLACK`, :data:`DECODE_OVERLAP_WEIGHT`)."""

    overlap: float = OVERLAP_WEIGHT
    home_slack: float = HOME_SLACK
    decode_overlap: float = DECODE_OVERLAP_WEIGHT


class CacheAwarePolicy(Policy):
    """Placement by locality weighed against load (weights: :class:`LocalityWeights`).

    Prefill: each candidate costs :meth:`prefill_cost` seconds (its predicted first token
    minus ``overlap`` times the prefill that only its local cache saves:
    :meth:`own_tokens`). With a ``prefix_key``, the candidates within ``home_slack`` of
    the cheapest (times the request's own prefill time) are the comparably loaded ones;
    among them the one with most own tokens wins, then the one with most own tokens the pool
    holds too (it would fetch them instead: a conversation's earlier turns where the pool
    has every turn), then the key's rendezvous home
    (:func:`rendezvous`; the key is the prompt's own, :func:`affinity_key`): prompts cached
    nowhere spread by a stable hash, the same prompt again goes where it went. A prefix
    that two candidates hold (a system prompt, a template) thus pulls to neither, so a
    worker that lacks it is not passed over for it and comes to hold it too.
    Without a key, the cheapest (first by worker id on ties).

    Decode: ascending :meth:`decode_cost` (running + waiting requests minus
    ``decode_overlap`` per whole prompt held locally: the conversation's earlier turns),
    then fewest queued prefill tokens (a mixed worker prefills what it is given: equal
    counts of requests can hide very different waits), then most free KV pages, then
    worker id. Both costs count load, so the router's
    pending placements (:mod:`router.placement.pending`) spread a burst of one prefix over workers
    once their load difference outweighs the overlap.
    """

    def __init__(
        self, disagg_threshold_tokens: int = 0, weights: LocalityWeights | None = None
    ) -> None:
        super().__init__(disagg_threshold_tokens)
        self.weights = weights or LocalityWeights()

    @staticmethod
    def own_tokens(
        request: PlacementRequest,
        worker: WorkerLoad,
        others: Sequence[WorkerLoad] = (),
        beyond_pool: bool = True,
    ) -> int:
        """Leading prompt tokens the local cache of ``worker`` holds beyond the pool (unless
        not ``beyond_pool``) and beyond the most any of ``others`` holds (itself among them is
        ignored): what no other candidate would save (``beyond_pool=False``: nor fetch from
        the pool without computing)."""
        elsewhere = (
            request.local_on(w.worker_id) for w in others if w.worker_id != worker.worker_id
        )
        floor = max(request.pooled_tokens if beyond_pool else 0, *elsewhere, 0)
        return max(0, request.local_on(worker.worker_id) - floor)

    def prefill_cost(
        self, request: PlacementRequest, worker: WorkerLoad, others: Sequence[WorkerLoad] = ()
    ) -> float:
        """``predicted_ttft - overlap * own / prefill_speed``, in seconds, where ``own`` is
        :meth:`own_tokens` against ``others`` (what only its local cache saves)."""
        own = self.own_tokens(request, worker, others)
        return predicted_ttft(request, worker) - self.weights.overlap * own / worker.prefill_speed

    def pick_prefill(self, request: PlacementRequest, candidates: list[WorkerLoad]) -> WorkerLoad:
        costs = [self.prefill_cost(request, w, candidates) for w in candidates]
        best = min(costs)
        key = request.prefix_key
        if key is None:
            return candidates[costs.index(best)]
        cheapest = candidates[costs.index(best)]
        bar = best + self.weights.home_slack * request.prompt_tokens / cheapest.prefill_speed
        near = [w for w, cost in zip(candidates, costs, strict=True) if cost <= bar]
        return max(
            near,
            key=lambda w: (
                self.own_tokens(request, w, candidates),
                self.own_tokens(request, w, candidates, beyond_pool=False),
                rendezvous(key, w.worker_id),
            ),
        )

    def decode_cost(self, request: PlacementRequest, worker: WorkerLoad) -> float:
        """``running + waiting - decode_overlap * local_tokens / prompt_tokens``, in
        requests."""
        share = (
            request.local_on(worker.worker_id) / request.prompt_tokens
            if request.prompt_tokens
            else 0.0
        )
        return worker.running + worker.waiting - self.weights.decode_overlap * share

    def rank_decode(
        self, request: PlacementRequest, candidates: list[WorkerLoad]
    ) -> list[WorkerLoad]:
        return sorted(
            candidates,
            key=lambda w: (self.decode_cost(request, w), w.queued_prefill_tokens, -w.free_pages),
        )

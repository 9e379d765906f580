"""Placement: which worker prefills a request and which one decodes it. Pure: no I/O.

Every policy sees the same inputs, a :class:`PlacementRequest` (prompt length, how much of
it the pool holds, optional per-worker local-cache hints) and one :class:`WorkerLoad` per
live worker, and answers a :class:`Placement`. The shared rules live in
:meth:`Policy.place`; a policy only ranks candidates.

Worker roles: ``prefill`` workers only prefill (then hand the KV over through the pool);
``decode`` workers decode, prefill short prompts themselves unless they are backed up
with them, and long ones only when the prefill workers are backed up (rule 4 of
:class:`Policy`); ``mixed`` workers do the whole request by themselves
and are used only when no decode worker is live.
"""

from __future__ import annotations

import hashlib
import random
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from router.placement.types import (
    DEFAULT_PREFILL_TOKENS_PER_S,
    HANDOFF_S,
    POOL_FETCH_S_PER_TOKEN,
    Placement,
    PlacementRequest,
    WorkerLoad,
    handoff_s,
    predicted_ttft,
    prefill_locally,
    prefill_remotely,
    remote_ttft,
)

__all__ = [
    "DEFAULT_PREFILL_TOKENS_PER_S",
    "HANDOFF_S",
    "POOL_FETCH_S_PER_TOKEN",
    "Placement",
    "PlacementRequest",
    "WorkerLoad",
    "handoff_s",
    "predicted_ttft",
    "prefill_locally",
    "prefill_remotely",
    "remote_ttft",
]

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


class Policy(ABC):
    """A placement policy.

    Contract of :meth:`place`, which every policy shares:

    1. draining workers are never chosen;
    2. decode candidates are the decode workers; only when there is none, the mixed ones;
       no candidate at all gives None ("not now": the caller answers 503);
    3. no prefill worker is used (the decode worker prefills locally) when the candidates
       are mixed workers or when no prefill worker is live;
    4. a prompt whose uncached part on the first decode candidate
       (:meth:`PlacementRequest.uncached_on`: neither the pool nor that worker's local
       cache holds it) exceeds ``disagg_threshold_tokens`` is prefilled by a prefill
       worker unless the decode worker would give its first token sooner even counting
       the stall its prefill causes the running decodes (:func:`prefill_locally`: the
       prefill workers are backed up, as at saturation; never with a threshold of 0 or
       less, which always disaggregates); a shorter one is prefilled locally by the first decode
       candidate unless a prefill worker would give its first token sooner
       (:func:`prefill_remotely`: the decode worker is backed up with prefills while a
       prefill worker idles, as in a burst of prompts that share a pooled prefix);
    5. :meth:`rank_decode` orders every decode candidate, best first (before rule 4,
       which needs the first one);
    6. :meth:`pick_prefill` chooses the prefill worker, when one is used.

    Subclasses must return one of the given candidates (and every one of them, for
    :meth:`rank_decode`); they may keep state (a counter, a seeded generator).
    """

    def __init__(self, disagg_threshold_tokens: int = 0) -> None:
        self.disagg_threshold_tokens = disagg_threshold_tokens

    def place(self, request: PlacementRequest, workers: Sequence[WorkerLoad]) -> Placement | None:
        live = sorted((w for w in workers if not w.draining), key=lambda w: w.worker_id)
        decoders = [w for w in live if w.role == "decode"]
        mixed = not decoders
        candidates = decoders or [w for w in live if w.role == "mixed"]
        if not candidates:
            return None
        prefillers = [] if mixed else [w for w in live if w.role == "prefill"]
        ranked = self.rank_decode(request, candidates)
        prefill = None
        if prefillers and self._disaggregate(request, prefillers, ranked[0]):
            prefill = self.pick_prefill(request, prefillers).worker_id
        return Placement(prefill, tuple(w.worker_id for w in ranked))

    def _disaggregate(
        self, request: PlacementRequest, prefillers: list[WorkerLoad], decoder: WorkerLoad
    ) -> bool:
        """Rule 4: whether a prefill worker prefills ``request`` rather than ``decoder``."""
        threshold = self.disagg_threshold_tokens
        if request.uncached_on(decoder.worker_id) > threshold:
            return threshold <= 0 or not prefill_locally(request, prefillers, decoder)
        return prefill_remotely(request, prefillers, decoder)

    @abstractmethod
    def pick_prefill(self, request: PlacementRequest, candidates: list[WorkerLoad]) -> WorkerLoad:
        """One of ``candidates`` (non-empty, sorted by worker id)."""

    @abstractmethod
    def rank_decode(
        self, request: PlacementRequest, candidates: list[WorkerLoad]
    ) -> list[WorkerLoad]:
        """A permutation of ``candidates`` (non-empty, sorted by worker id), best first."""


class RandomPolicy(Policy):
    """Uniformly random choices from a seeded generator (reproducible)."""

    def __init__(self, disagg_threshold_tokens: int = 0, seed: int = 0) -> None:
        super().__init__(disagg_threshold_tokens)
        self._rng = random.Random(seed)

    def pick_prefill(self, request: PlacementRequest, candidates: list[WorkerLoad]) -> WorkerLoad:
        return self._rng.choice(candidates)

    def rank_decode(
        self, request: PlacementRequest, candidates: list[WorkerLoad]
    ) -> list[WorkerLoad]:
        return self._rng.sample(candidates, len(candidates))


class RoundRobinPolicy(Policy):
    """Takes workers in worker-id order, one step further each request (per pool)."""

    def __init__(self, disagg_threshold_tokens: int = 0) -> None:
        super().__init__(disagg_threshold_tokens)
        self._next_prefill = 0
        self._next_decode = 0

    def pick_prefill(self, request: PlacementRequest, candidates: list[WorkerLoad]) -> WorkerLoad:
        chosen = candidates[self._next_prefill % len(candidates)]
        self._next_prefill += 1
        return chosen

    def rank_decode(
        self, request: PlacementRequest, candidates: list[WorkerLoad]
    ) -> list[WorkerLoad]:
        start = self._next_decode % len(candidates)
        self._next_decode += 1
        return candidates[start:] + candidates[:start]


class LeastLoadedPolicy(Policy):
    """Prefill: fewest queued prefill tokens, then fewest running + waiting requests.
    Decode: fewest running + waiting requests, then fewest queued prefill tokens."""

    def pick_prefill(self, request: PlacementRequest, candidates: list[WorkerLoad]) -> WorkerLoad:
        return min(candidates, key=lambda w: (w.queued_prefill_tokens, w.running + w.waiting))

    def rank_decode(
        self, request: PlacementRequest, candidates: list[WorkerLoad]
    ) -> list[WorkerLoad]:
        return sorted(candidates, key=lambda w: (w.running + w.waiting, w.queued_prefill_tokens))


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


def make_policy(name: str, disagg_threshold_tokens: int, seed: int = 0) -> Policy:
    """The policy called ``name`` (one of :data:`router.config.POLICIES`)."""
    if name == "random":
        return RandomPolicy(disagg_threshold_tokens, seed)
    if name == "round_robin":
        return RoundRobinPolicy(disagg_threshold_tokens)
    if name == "least_loaded":
        return LeastLoadedPolicy(disagg_threshold_tokens)
    if name == "cache_aware":
        return CacheAwarePolicy(disagg_threshold_tokens)
    raise ValueError(f"unknown policy {name!r}")

"""Placement: which worker prefills a request and which one decodes it. Pure: no I/O.

Every policy sees the same inputs, a :class:`PlacementRequest` (prompt length, how much of
it the pool holds, optional per-worker local-cache hints) and one :class:`WorkerLoad` per
live worker, and answers a :class:`Placement`. The shared rules live in
:meth:`Policy.place`; a policy only ranks candidates.

Worker roles: ``prefill`` workers only prefill (then hand the KV over through the pool);
``decode`` workers decode, and prefill short prompts themselves unless they are backed up
with them (rule 4 of :class:`Policy`); ``mixed`` workers do the whole request by themselves
and are used only when no decode worker is live.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

DEFAULT_PREFILL_TOKENS_PER_S = 2000.0
"""Prefill speed assumed for a worker that has not measured its own yet (reports 0)."""

POOL_FETCH_S_PER_TOKEN = 2e-5
"""Seconds to load one prompt token's KV (all layers) from the pool into a worker that has
not measured its own speed yet (:attr:`WorkerLoad.pool_fetch_tokens_per_s` is 0): about
50k tokens/s, a few GB/s for a small model over TCP."""

HANDOFF_S = 0.05
"""Fixed seconds a hand-off adds to a request's first token over a local prefill: the
reservation and prefill RPCs and the landing's polling. A rough constant: it keeps a short
prompt on its decode worker unless that worker is clearly backed up
(:func:`prefill_remotely`)."""


@dataclass(frozen=True)
class WorkerLoad:
    """A worker as the conductor sees it (the fields of its latest ``LoadReport``)."""

    worker_id: str
    role: str
    draining: bool = False
    waiting: int = 0
    running: int = 0
    queued_prefill_tokens: int = 0
    free_pages: int = 0
    total_pages: int = 0
    prefill_tokens_per_s: float = 0.0
    pool_fetch_tokens_per_s: float = 0.0
    """Prompt tokens of KV per second the worker read from the pool so far (its landings'
    bytes over their read time, per token); 0: not measured yet."""
    report_at: float = 0.0
    """When the worker made this report (its clock); tells reports apart, nothing more."""

    @property
    def prefill_speed(self) -> float:
        speed = self.prefill_tokens_per_s
        return speed if speed > 0 else DEFAULT_PREFILL_TOKENS_PER_S

    @property
    def fetch_s_per_token(self) -> float:
        """Seconds to load one token's KV from the pool: measured, else
        :data:`POOL_FETCH_S_PER_TOKEN`."""
        speed = self.pool_fetch_tokens_per_s
        return 1.0 / speed if speed > 0 else POOL_FETCH_S_PER_TOKEN


@dataclass(frozen=True)
class PlacementRequest:
    """``pooled_tokens``: leading prompt tokens the pool holds; ``local_tokens``: per
    worker id, leading prompt tokens that worker's own prefix cache holds (hints)."""

    prompt_tokens: int
    pooled_tokens: int = 0
    local_tokens: Mapping[str, int] = field(default_factory=dict)

    @property
    def uncached_tokens(self) -> int:
        return max(0, self.prompt_tokens - self.pooled_tokens)

    def local_on(self, worker_id: str) -> int:
        """Leading prompt tokens the local cache of ``worker_id`` holds (per the hints)."""
        return min(self.local_tokens.get(worker_id, 0), self.prompt_tokens)


@dataclass(frozen=True)
class Placement:
    """``prefill``: the prefill worker, or None when the decode worker prefills itself.
    ``decode``: decode (or mixed) workers, best first; the flow tries them in order."""

    prefill: str | None
    decode: tuple[str, ...]

    @property
    def disaggregated(self) -> bool:
        return self.prefill is not None


class Policy(ABC):
    """A placement policy.

    Contract of :meth:`place`, which every policy shares:

    1. draining workers are never chosen;
    2. decode candidates are the decode workers; only when there is none, the mixed ones;
       no candidate at all gives None ("not now": the caller answers 503);
    3. no prefill worker is used (the decode worker prefills locally) when the candidates
       are mixed workers or when no prefill worker is live;
    4. a prompt whose uncached part exceeds ``disagg_threshold_tokens`` is prefilled by a
       prefill worker (the decode worker never runs a long prefill: steady inter-token
       latency); a shorter one is prefilled locally by the first decode candidate unless a
       prefill worker would give its first token sooner (:func:`prefill_remotely`: the
       decode worker is backed up with prefills while a prefill worker idles, as in a burst
       of prompts that share a pooled prefix);
    5. :meth:`pick_prefill` chooses the prefill worker, when one is used;
    6. :meth:`rank_decode` orders every decode candidate, best first.

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
        prefill = None  # long prompts pick before ranking, as always (seeded policies' order)
        if prefillers and request.uncached_tokens > self.disagg_threshold_tokens:
            prefill = self.pick_prefill(request, prefillers).worker_id
        ranked = self.rank_decode(request, candidates)
        if prefill is None and prefillers and prefill_remotely(request, prefillers, ranked[0]):
            prefill = self.pick_prefill(request, prefillers).worker_id
        return Placement(prefill, tuple(w.worker_id for w in ranked))

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


def predicted_ttft(request: PlacementRequest, worker: WorkerLoad) -> float:
    """Seconds until ``worker`` would produce the first token of ``request``.

    Queue wait (its queued prefill tokens at its speed) + the tokens neither its local
    cache nor the pool holds, at its speed + the pooled tokens its local cache lacks, at
    its pool fetch speed (:attr:`WorkerLoad.fetch_s_per_token`).
    """
    local = request.local_on(worker.worker_id)
    cached = max(local, min(request.pooled_tokens, request.prompt_tokens))
    fetched = max(0, cached - local)
    speed = worker.prefill_speed
    queue_s = worker.queued_prefill_tokens / speed
    compute_s = (request.prompt_tokens - cached) / speed
    return queue_s + compute_s + fetched * worker.fetch_s_per_token


def handoff_s(request: PlacementRequest, decoder: WorkerLoad) -> float:
    """Seconds a hand-off to ``decoder`` adds: :data:`HANDOFF_S`, plus loading the prompt's
    KV that its own cache lacks at its pool fetch speed."""
    missing = request.prompt_tokens - request.local_on(decoder.worker_id)
    return HANDOFF_S + missing * decoder.fetch_s_per_token


def prefill_remotely(
    request: PlacementRequest, prefillers: Sequence[WorkerLoad], decoder: WorkerLoad
) -> bool:
    """Whether a short prompt should still go to a prefill worker: true when the soonest of
    ``prefillers`` plus the handoff to ``decoder`` (:func:`handoff_s`) predicts an earlier
    first token than ``decoder`` prefilling it itself (:func:`predicted_ttft`, which counts
    the prefills queued on each); ties stay local. Pure; the pending placements of
    :mod:`router.pending` are in the loads, so a burst spreads over both instead of piling
    up on the decode worker."""
    remote = min(predicted_ttft(request, w) for w in prefillers) + handoff_s(request, decoder)
    return remote < predicted_ttft(request, decoder)


class CacheAwarePolicy(Policy):
    """Prefill: lowest :func:`predicted_ttft`. Decode: most free KV pages (room for the
    request and its batch mates, hence steady inter-token latency), then fewest running."""

    def pick_prefill(self, request: PlacementRequest, candidates: list[WorkerLoad]) -> WorkerLoad:
        return min(candidates, key=lambda w: predicted_ttft(request, w))

    def rank_decode(
        self, request: PlacementRequest, candidates: list[WorkerLoad]
    ) -> list[WorkerLoad]:
        return sorted(candidates, key=lambda w: (-w.free_pages, w.running + w.waiting))


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

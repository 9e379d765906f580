"""What placement sees and answers, and its time model. Pure: no I/O.

:class:`WorkerLoad` (a worker's latest load report), :class:`PlacementRequest` (a prompt and
what the caches hold of it) and :class:`Placement` (the answer), with the seconds a
placement is predicted to take (:func:`predicted_ttft`, :func:`handoff_s`,
:func:`remote_ttft`, :func:`prefill_remotely`, :func:`prefill_locally`). The policies that
use them are :mod:`router.placement.policies`, which re-exports every name here.
"""

from __future__ import annotations

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
    worker id, leading prompt tokens that worker's own prefix cache holds (hints);
    ``prefix_key``: the prompt's :func:`affinity_key` (None: no full block), which
    :class:`CacheAwarePolicy` hashes to spread prompts cached nowhere and to send the same
    prompt again where it went before."""

    prompt_tokens: int
    pooled_tokens: int = 0
    local_tokens: Mapping[str, int] = field(default_factory=dict)
    prefix_key: int | None = None
    block_tokens: int = 0
    """Tokens per KV page, for the pages the prompt needs (0: unknown)."""

    @property
    def uncached_tokens(self) -> int:
        """Prompt tokens the pool lacks (whoever prefills)."""
        return max(0, self.prompt_tokens - self.pooled_tokens)

    def local_on(self, worker_id: str) -> int:
        """Leading prompt tokens the local cache of ``worker_id`` holds (per the hints)."""
        return min(self.local_tokens.get(worker_id, 0), self.prompt_tokens)

    def uncached_on(self, worker_id: str) -> int:
        """Prompt tokens ``worker_id`` would compute: neither the pool nor its local cache
        holds them (``prompt - max(pooled, local)``, at least 0)."""
        return max(0, self.prompt_tokens - max(self.pooled_tokens, self.local_on(worker_id)))


@dataclass(frozen=True)
class Placement:
    """``prefill``: the prefill worker, or None when the decode worker prefills itself.
    ``decode``: decode (or mixed) workers, best first; the flow tries them in order."""

    prefill: str | None
    decode: tuple[str, ...]

    @property
    def disaggregated(self) -> bool:
        return self.prefill is not None


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


def remote_ttft(
    request: PlacementRequest, prefillers: Sequence[WorkerLoad], decoder: WorkerLoad
) -> float:
    """Seconds until the first token if the soonest of ``prefillers`` prefills ``request``
    and hands it to ``decoder`` (:func:`predicted_ttft` + :func:`handoff_s`)."""
    return min(predicted_ttft(request, w) for w in prefillers) + handoff_s(request, decoder)


def prefill_locally(
    request: PlacementRequest, prefillers: Sequence[WorkerLoad], decoder: WorkerLoad
) -> bool:
    """Whether a long prompt (past the disaggregation threshold) should still be prefilled
    by its decode worker: never while a prefill worker has nothing queued, so on an idle
    cluster the decode worker never runs a long prefill (steady inter-token latency); else
    nor while ``decoder`` lacks the free pages for the prompt (it would queue it; the
    hand-off's reservation waits its turn instead); else true when ``decoder`` would give
    the first token sooner than the soonest of
    ``prefillers`` (:func:`predicted_ttft`; the hand-off is not counted, so a short queue
    never tips a small prompt over) even after paying its own compute twice over, once for
    the request and once more for the decodes its prefill stalls
    (:meth:`PlacementRequest.uncached_on` at its speed). Pure.

    Once the prefill workers are backed up (a burst, saturation) the decode worker takes
    prompts while its own queue plus the prompt is shorter than theirs less the prompt,
    and both kinds of worker prefill instead of the decode workers' cores idling between
    steps. The pending placements of :mod:`router.placement.pending` are in the loads, so a burst
    splits between them."""
    if any(w.queued_prefill_tokens == 0 for w in prefillers):
        return False
    if request.block_tokens and decoder.free_pages * request.block_tokens < request.prompt_tokens:
        return False  # it could not hold the prompt now: the hand-off waits for pages instead
    own_compute = request.uncached_on(decoder.worker_id) / decoder.prefill_speed
    local = predicted_ttft(request, decoder) + own_compute
    return local < min(predicted_ttft(request, w) for w in prefillers)


def prefill_remotely(
    request: PlacementRequest, prefillers: Sequence[WorkerLoad], decoder: WorkerLoad
) -> bool:
    """Whether a short prompt should still go to a prefill worker: true when the soonest of
    ``prefillers`` plus the handoff to ``decoder`` (:func:`handoff_s`) predicts an earlier
    first token than ``decoder`` prefilling it itself (:func:`predicted_ttft`, which counts
    the prefills queued on each); ties stay local. Pure; the pending placements of
    :mod:`router.placement.pending` are in the loads, so a burst spreads over both instead of piling
    up on the decode worker."""
    return remote_ttft(request, prefillers, decoder) < predicted_ttft(request, decoder)

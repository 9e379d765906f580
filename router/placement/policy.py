"""The placement policy's contract: which worker prefills a request and which one decodes
it. Pure: no I/O.

Every policy sees the same inputs, a :class:`PlacementRequest` (prompt length, how much of
it the pool holds, optional per-worker local-cache hints) and one :class:`WorkerLoad` per
live worker, and answers a :class:`Placement`. The shared rules live in
:meth:`Policy.place`; a policy only ranks candidates (the policies themselves:
:mod:`router.placement.policies`).

Worker roles: ``prefill`` workers only prefill (then hand the KV over through the pool);
``decode`` workers decode, prefill short prompts themselves unless they are backed up
with them, and long ones only when the prefill workers are backed up (rule 4 of
:class:`Policy`); ``mixed`` workers do the whole request by themselves
and are used only when no decode worker is live.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from router.placement.types import (
    Placement,
    PlacementRequest,
    WorkerLoad,
    prefill_locally,
    prefill_remotely,
)


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

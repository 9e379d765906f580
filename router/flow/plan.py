"""A request's plan: which workers, under which lease and deadline (:class:`FlowPlan`),
and how an admitted request gets one (:class:`Planner`: pool lookup, placement, admission).

:meth:`Planner.plan` runs, for one :class:`~router.flow.admitted.AdmittedRequest`:

1. the prompt's block names (:meth:`PoolLookup.prompt_chain` under the request's cache
   salt, with the first live worker's record naming the key space), then the pool lookup
   (:meth:`PoolLookup.pooled`) and each worker's local hits from the router's prefix index
   (:meth:`LocalIndex.local_tokens`, :class:`router.placement.kv_index.KVIndex` in the router);
   none when no worker is live;
2. placement (:meth:`Policy.place` over the load reports plus this router's recent
   placements, :class:`PendingLoad`): 503 when nobody can serve it; a request that wants
   its prompt's logprobs is not disaggregated (its decode worker computes it whole);
3. admission control (:func:`router.placement.admission.admit`): 429 with ``Retry-After`` when the
   first token is predicted too late (counted per worker; nothing counted as pending);
4. the placement noted as pending (its loads) and told to the index (the workers it goes to
   will cache the prompt: :meth:`LocalIndex.placed`), and the :class:`FlowPlan` built
   from it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from proto import worker_pb2 as pb
from router.config import RouterConfig
from router.errors import APIError, too_busy, unavailable
from router.flow.admitted import AdmittedRequest
from router.placement.admission import admit
from router.placement.live_worker import LiveWorker
from router.placement.pending import PendingLoad
from router.placement.policies import PlacementRequest, affinity_key, make_policy
from router.placement.pool_lookup import PoolLookup


class LocalIndex(Protocol):
    """Where the workers' local prefix caches are known
    (:class:`router.placement.kv_index.KVIndex`)."""

    def local_tokens(self, chain: Sequence[int], block_tokens: int) -> dict[str, int]:
        """Leading prompt tokens (of the usable block names ``chain``) cached per known
        worker; workers it does not know are left out."""
        ...

    def placed(self, worker_ids: Sequence[str], chain: Sequence[int]) -> None:
        """A prompt of usable block names ``chain`` was placed on ``worker_ids``."""
        ...


class NoIndex:
    """A :class:`LocalIndex` that knows nothing (no prediction for any worker)."""

    def local_tokens(self, chain: Sequence[int], block_tokens: int) -> dict[str, int]:
        return {}

    def placed(self, worker_ids: Sequence[str], chain: Sequence[int]) -> None:
        return None


@dataclass(frozen=True)
class FlowPlan:
    """Everything a flow needs, fixed before any worker is called.

    ``request_id`` is the router's own (uuid4 hex: never from a client, never with '/');
    ``decode``: the decode (or mixed) candidates, best first; ``started_at``: when the
    request arrived (``clock`` time; TTFT and the deadline count from it).
    """

    request_id: str
    prompt_token_ids: Sequence[int]
    params: pb.SamplingParams
    prefill: LiveWorker | None
    decode: tuple[LiveWorker, ...]
    lease_ms: int
    timeout_s: float
    started_at: float
    cache_salt: str = ""
    push: bool = False
    """Offer a direct push of the prompt's KV (``RouterConfig.kv_handoff``)."""
    predicted_local: Mapping[str, int] = field(default_factory=dict)
    """Leading prompt tokens the router's index said each worker's local cache holds,
    for the workers it knows (the others: no prediction)."""
    clock: Callable[[], float] = field(default=time.monotonic)

    @property
    def mode(self) -> str:
        """``local`` (no prefill worker) or ``disagg``, as planned."""
        return "local" if self.prefill is None else "disagg"

    def elapsed(self) -> float:
        """Seconds since the request arrived."""
        return self.clock() - self.started_at

    def seconds_left(self) -> float:
        """Seconds until the request's deadline (negative once past)."""
        return self.timeout_s - self.elapsed()

    def time_left(self) -> float:
        """:meth:`seconds_left` for an RPC's timeout; 504 once the deadline passed."""
        left = self.seconds_left()
        if left <= 0:
            raise APIError(504, "the request timed out", None, "timeout")
        return left


class Planner:
    """Placement -> :class:`FlowPlan`, as in the module docstring; one per router (its
    pending placements are shared by every request). ``refused(worker_id)`` counts each
    request admission control refuses, by the worker it would have waited on."""

    def __init__(
        self,
        config: RouterConfig,
        live: Callable[[], list[LiveWorker]],
        pool: PoolLookup,
        refused: Callable[[str], None],
        index: LocalIndex | None = None,
    ) -> None:
        self.config = config
        self._live = live
        self._pool = pool
        self._index: LocalIndex = index if index is not None else NoIndex()
        self._refused = refused
        self.policy = make_policy(config.policy, config.disagg_threshold_tokens)
        self.pending = PendingLoad()

    async def plan(self, admitted: AdmittedRequest) -> FlowPlan:
        """Look the prompt up in the pool (under its cache salt) and place it; 503 when
        nobody can serve it, 429 when admission control refuses it."""
        prompt = admitted.prompt_token_ids
        live = self._live()
        chain = (
            self._pool.prompt_chain(prompt, live[0].record, admitted.cache_salt) if live else None
        )
        pooled, local, usable = 0, {}, []
        if chain is not None:
            pooled = await self._pool.pooled(chain)
            usable = chain.usable(len(prompt))
            local = self._index.local_tokens(usable, chain.block_tokens)
        key = affinity_key(chain.hashes) if chain is not None else None
        pages = chain.block_tokens if chain is not None else 0
        request = PlacementRequest(len(prompt), pooled, local, key, pages)
        loads = self.pending.apply([w.load() for w in live])
        placement = self.policy.place(request, loads)
        if placement is None:
            raise unavailable("no decode-capable worker can take a request now")
        if admitted.params.HasField("prompt_logprobs"):
            placement = replace(placement, prefill=None)  # computed whole, on one worker
        rejection = admit(placement, request, loads, self.config.admission_ttft_s)
        if rejection is not None:
            self._refused(rejection.worker)
            raise too_busy(rejection.message, rejection.retry_after_s)
        self.pending.placed(placement, request, loads)
        self._index.placed([placement.prefill or placement.decode[0], placement.decode[0]], usable)
        by_id = {w.worker_id: w for w in live}
        return FlowPlan(
            request_id=admitted.request_id,
            prompt_token_ids=list(prompt),
            params=admitted.params,
            prefill=by_id[placement.prefill] if placement.prefill else None,
            decode=tuple(by_id[d] for d in placement.decode),
            lease_ms=self.config.reserve_lease_ms,
            timeout_s=self.config.request_timeout_s,
            started_at=admitted.arrived_at,
            cache_salt=admitted.cache_salt,
            push=self.config.kv_handoff == "push",
            predicted_local=local,
        )

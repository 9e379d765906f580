"""Placement by session, for the trace replay only: what the router's scoring is compared
with (``kvserve bench trace --policies session_affinity home_spill``). Pure.

Both key a request by its session: the session the trace names
(:attr:`~kvserve.sim.trace.replay.TraceRequest.session`, known for generated traces), else
the name of the prompt's first block (a Mooncake trace names no session: its prompts
sharing a first block stand for one).
The router sees no session today (an API field would have to carry one, as OpenAI's
``prompt_cache_key`` does), so these measure what knowing it would be worth.

- :class:`SessionAffinityPolicy` (``session_affinity``): every request of a session on its
  session's rendezvous home, whatever the load (sticky sessions);
- :class:`HomeSpillPolicy` (``home_spill``): the first worker of the session's rendezvous
  order whose predicted first token is within the spill threshold of the soonest one
  (:attr:`~router.placement.policies.LocalityWeights.home_slack`, in units of the request's own
  prefill time, as for ``cache_aware``): a home that spills to a stable second choice
  (consistent hashing with bounded loads).

Decode placement is ``cache_aware``'s
(:meth:`~router.placement.policies.CacheAwarePolicy.rank_decode`).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvserve.sim.trace.replay import TraceRequest
from router.placement.policies import (
    CacheAwarePolicy,
    PlacementRequest,
    WorkerLoad,
    predicted_ttft,
    rendezvous,
)


class SessionPolicy(CacheAwarePolicy):
    """A policy whose ``prefix_key`` is the request's session key (:func:`session_key`)."""

    def by_home(self, request: PlacementRequest, candidates: list[WorkerLoad]) -> list[WorkerLoad]:
        """``candidates`` in the rendezvous order of the request's key, home first (by
        worker id when it has no key)."""
        key = request.prefix_key
        if key is None:
            return candidates
        return sorted(candidates, key=lambda w: rendezvous(key, w.worker_id), reverse=True)


class SessionAffinityPolicy(SessionPolicy):
    """Prefill on the session's home, always (module docstring)."""

    def pick_prefill(self, request: PlacementRequest, candidates: list[WorkerLoad]) -> WorkerLoad:
        return self.by_home(request, candidates)[0]


class HomeSpillPolicy(SessionPolicy):
    """Prefill on the first of the session's rendezvous order within the spill threshold
    of the soonest first token (module docstring)."""

    def pick_prefill(self, request: PlacementRequest, candidates: list[WorkerLoad]) -> WorkerLoad:
        ttft = {w.worker_id: predicted_ttft(request, w) for w in candidates}
        soonest = min(candidates, key=lambda w: ttft[w.worker_id])
        bar = ttft[soonest.worker_id] + (
            self.weights.home_slack * request.prompt_tokens / soonest.prefill_speed
        )
        return next(w for w in self.by_home(request, candidates) if ttft[w.worker_id] <= bar)


SESSION_POLICIES: dict[str, type[SessionPolicy]] = {
    "session_affinity": SessionAffinityPolicy,
    "home_spill": HomeSpillPolicy,
}


def session_key(request: TraceRequest, chain: Sequence[int]) -> int | None:
    """The key :class:`SessionPolicy` places ``request`` by: its session when the trace
    names one, else the name of the first block of its ``chain`` (None: no block)."""
    if request.session >= 0:
        return request.session
    return chain[0] if chain else None

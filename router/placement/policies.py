"""The placement policies, by name (:func:`make_policy`): ``random``, ``round_robin``,
``least_loaded`` (here) and ``cache_aware`` (:mod:`router.placement.cache_aware`). Pure: no
I/O. Their shared contract is :class:`router.placement.policy.Policy`; this module also
re-exports the policies' types and time model (:mod:`router.placement.types`) and the
cache-aware policy's names, for the router and the simulator.
"""

from __future__ import annotations

import random

from router.placement.cache_aware import (
    DECODE_OVERLAP_WEIGHT,
    HOME_SLACK,
    OVERLAP_WEIGHT,
    CacheAwarePolicy,
    LocalityWeights,
    affinity_key,
    rendezvous,
)
from router.placement.policy import Policy
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
    "DECODE_OVERLAP_WEIGHT",
    "DEFAULT_PREFILL_TOKENS_PER_S",
    "HANDOFF_S",
    "HOME_SLACK",
    "OVERLAP_WEIGHT",
    "POOL_FETCH_S_PER_TOKEN",
    "CacheAwarePolicy",
    "LocalityWeights",
    "Placement",
    "PlacementRequest",
    "Policy",
    "WorkerLoad",
    "affinity_key",
    "handoff_s",
    "predicted_ttft",
    "prefill_locally",
    "prefill_remotely",
    "remote_ttft",
    "rendezvous",
]


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

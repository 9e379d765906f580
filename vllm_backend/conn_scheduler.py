"""The scheduler side of the kvserve connector (in vLLM's engine core process).

vLLM asks it, for each request it admits, how many prompt tokens past its own prefix cache
the pool holds (:meth:`SchedulerSide.matched`: one batched existence call over our block
names, :mod:`vllm_backend.plans`), tells it which pages it gave the request
(:meth:`SchedulerSide.allocated`), and once per step asks for the step's plan
(:meth:`SchedulerSide.step_plan`): the loads vLLM accepted and the writes the step may
make, which vLLM hands to the worker side (:mod:`vllm_backend.conn_worker`) with the step.
It joins the pool without memory of its own (as the router does: lookups only).

A request is tracked from its first lookup to :meth:`SchedulerSide.finished`. Its
``kv_transfer_params`` (set by ``kvserve worker --engine vllm``; absent for a plain vLLM
request) carry the router's request id and whether it is handed off or adopted; vLLM's own
``cache_salt`` is the chain's salt, so tenants never share a name here either.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvpool.keys import KeySpace, longest_prefix
from kvpool.layout import KVLayout
from kvpool.store import MooncakeStore, PoolUnavailableError
from kvpool.stream import WriteIntent
from vllm_backend.plans import ADOPT, HANDOFF, RID, LoadItem, Planner, Tracked
from vllm_backend.reports import Reporter
from vllm_backend.spec import ConnectorSpec

log = logging.getLogger(__name__)


@dataclass
class StepPlan:
    """What one step loads and writes (vLLM pickles it to the worker side)."""

    loads: list[LoadItem] = field(default_factory=list)
    writes: list[WriteIntent] = field(default_factory=list)
    wait_commit: bool = False
    """A hand-off prompt's prefill ends in the step: its metas must be in the pool before
    the step's outputs leave (a decode worker looks the prompt up once)."""


class SchedulerSide:
    """See the module docstring."""

    def __init__(self, spec: ConnectorSpec, block_tokens: int) -> None:
        self.planner = Planner(spec.hasher, block_tokens)
        layers = KVLayout.from_wire(spec.wire).num_layers
        self.keys = KeySpace.of(spec.namespace, layers, spec.cluster.keyring.pool_block)
        self.reporter = Reporter(spec.reports)
        self.store: MooncakeStore | None = None
        config = dataclasses.replace(spec.pool, pool_segment_mib=0, pool_ssd_dir="")
        try:
            self.store = MooncakeStore.connect(config)
        except PoolUnavailableError as exc:
            log.warning("kvserve connector: no pool lookups (%s)", exc)
        self.tracked: dict[str, Tracked] = {}
        self._requests: dict[str, Any] = {}
        """vLLM's request objects of the tracked ids (their token ids grow in place)."""
        self._loads: list[LoadItem] = []

    def _track(self, request: Any) -> Tracked:
        tracked = self.tracked.get(request.request_id)
        if tracked is None:
            params = request.kv_transfer_params or {}
            adopt = bool(params.get(ADOPT))  # its prompt: the handed-off one + first token
            tracked = Tracked(
                rid=str(params.get(RID) or request.request_id),
                salt=request.cache_salt or "",
                handoff=bool(params.get(HANDOFF)),
                adopt=adopt,
                prompt_len=len(request.prompt_token_ids or ()) - adopt,
            )
            self.tracked[request.request_id] = tracked
        self._requests[request.request_id] = request
        return tracked

    def _present(self, names: list[int]) -> int:
        if self.store is None or not self.store.available:
            return 0
        return longest_prefix(self.store, self.keys, names)

    def _partial_present(self, rid: str) -> bool:
        if self.store is None or not self.store.available:
            return False
        key = self.keys.request_key(rid)
        return all(f == 1 for f in self.store.exists([key, *self.keys.layer_keys(key)]))

    def matched(self, request: Any, held_tokens: int) -> int:
        """Tokens past ``held_tokens`` the pool holds for ``request`` (0 on any failure:
        the pool is a cache)."""
        tracked = self._track(request)
        tracked.written = None
        if getattr(request, "skip_reading_prefix_cache", False):
            tracked.match = (held_tokens // self.planner.bt, 0, 0)
            return 0
        tokens = request.all_token_ids[: request.num_tokens]
        try:
            return self.planner.match(
                tracked, tokens, held_tokens, self._present, self._partial_present
            )
        except Exception as exc:  # a lookup that fails is a miss, never a failed request
            log.warning("kvserve connector: lookup for %s failed: %s", tracked.rid, exc)
            tracked.match = (held_tokens // self.planner.bt, 0, 0)
            return 0

    def allocated(self, request: Any, block_ids: list[int], external: int) -> None:
        """vLLM gave ``request`` the pages ``block_ids`` and takes ``external`` tokens of
        the last :meth:`matched` from the pool: plan that load for the next step."""
        tracked = self._track(request)
        item = self.planner.load(request.request_id, tracked, block_ids, external)
        if item is not None:
            self._loads.append(item)
        self.reporter.send("admit", rid=tracked.rid, pool=max(0, external))

    def step_plan(
        self, num_scheduled: dict[str, int], blocks_of: Callable[[str], list[int]]
    ) -> StepPlan:
        """The plan of a step scheduling ``num_scheduled`` tokens per request id (before
        vLLM advances the requests' computed counts); ``blocks_of(req_id)`` gives a
        request's pages."""
        plan = StepPlan(loads=self._loads)
        self._loads = []
        for req_id, scheduled in num_scheduled.items():
            tracked, request = self.tracked.get(req_id), self._requests.get(req_id)
            if tracked is None or request is None:
                continue
            computed = request.num_computed_tokens
            intent = self.planner.write(
                tracked, request.all_token_ids, computed, scheduled, blocks_of(req_id)
            )
            if intent is not None:
                plan.writes.append(intent)
                plan.wait_commit |= intent.partial is not None or (
                    tracked.handoff and computed + scheduled == tracked.prompt_len
                )
        return plan

    def finished(self, req_id: str) -> None:
        self.tracked.pop(req_id, None)
        self._requests.pop(req_id, None)

    def close(self) -> None:
        self.reporter.close()
        if self.store is not None:
            self.store.close()

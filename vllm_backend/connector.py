"""``KVServeConnector``: kvserve's pool as vLLM's external KV store (vLLM's v1 KV connector
API, ``KVConnectorBase_V1``), loaded by vLLM from::

    --kv-transfer-config '{"kv_connector": "KVServeConnector",
                           "kv_connector_module_path": "vllm_backend.connector",
                           "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
                           "kv_connector_extra_config": {"kvserve_spec": "<spec file>"}}'

(``kvserve worker --engine vllm`` writes the spec, :mod:`vllm_backend.spec`, and this
config). vLLM builds one instance per role: the scheduler's (:mod:`vllm_backend.conn_scheduler`)
and the model worker's (:mod:`vllm_backend.conn_worker`); this class only routes vLLM's
hooks to the one its role has.

Hooks implemented: scheduler side ``get_num_new_matched_tokens`` (pool lookup over our
block names; loads are synchronous, so it answers ``False`` for async),
``update_state_after_alloc`` (plans the load into the pages vLLM gave), ``build_connector_meta``
(the step's loads and writes), ``request_finished`` (forgets the request; blocks are freed
at once: writes finish within the step). Worker side ``register_kv_caches``,
``start_load_kv`` / ``wait_for_layer_load`` (layer by layer, verified before use),
``save_kv_layer`` / ``wait_for_save`` (each layer put while the next computes; the metas
committed after), ``get_block_ids_with_load_errors`` (what did not arrive whole: vLLM
recomputes it under ``kv_load_failure_policy: recompute``), ``shutdown``. Not needed here:
``get_finished`` (no asynchronous transfers), ``take_events`` (vLLM's own KV events carry
its cache; the worker translates them, :mod:`vllm_backend.events`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.model_executor.models.utils import extract_layer_index

from vllm_backend.conn_scheduler import SchedulerSide, StepPlan
from vllm_backend.conn_worker import WorkerSide
from vllm_backend.spec import SPEC_KEY, ConnectorSpec
from workers.serve.lifetime import die_with_parent

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request


class StepMetadata(KVConnectorMetadata):  # type: ignore[misc]
    """One step's :class:`~vllm_backend.conn_scheduler.StepPlan`, as vLLM carries it."""

    def __init__(self, plan: StepPlan) -> None:
        self.plan = plan


class KVServeConnector(KVConnectorBase_V1):  # type: ignore[misc]
    """See the module docstring."""

    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig
    ) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        die_with_parent()  # vLLM's processes go with the worker, even when it is killed
        path = self._kv_transfer_config.get_from_extra_config(SPEC_KEY, "")
        if not path:
            raise ValueError(f"KVServeConnector needs kv_connector_extra_config.{SPEC_KEY}")
        spec = ConnectorSpec.load(path)
        block_tokens = vllm_config.cache_config.block_size
        if block_tokens != spec.namespace.block_tokens:
            raise ValueError(
                f"vLLM's block size {block_tokens} is not the cluster's "
                f"{spec.namespace.block_tokens} (--block-tokens)"
            )
        self._config = vllm_config
        self._scheduler: SchedulerSide | None = None
        self._worker: WorkerSide | None = None
        if role == KVConnectorRole.SCHEDULER:
            self._scheduler = SchedulerSide(spec, block_tokens)
        else:
            self._worker = WorkerSide(spec)

    # -- worker side ----------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        assert self._worker is not None
        context = self._config.compilation_config.static_forward_context
        layer = context[min(kv_caches, key=extract_layer_index)]

        def write(key: torch.Tensor, value: torch.Tensor, cache: torch.Tensor) -> None:
            slots = torch.arange(key.shape[0], dtype=torch.int64, device=key.device)
            layer.impl.do_kv_cache_update(layer, key, value, cache, slots)

        self._worker.register(kv_caches, extract_layer_index, write)

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        if self._worker is not None and isinstance(connector_metadata, StepMetadata):
            self._worker.begin(connector_metadata.plan)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        if self._worker is not None:
            self._worker.start_loads()

    def wait_for_layer_load(self, layer_name: str) -> None:
        if self._worker is not None:
            self._worker.wait_layer(layer_name)

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any
    ) -> None:
        if self._worker is not None:
            self._worker.save_layer(layer_name)

    def wait_for_save(self) -> None:
        if self._worker is not None:
            self._worker.end_step()

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._worker.load_errors() if self._worker is not None else set()

    def shutdown(self) -> None:
        for side in (self._worker, self._scheduler):
            if side is not None:
                side.close()

    # -- scheduler side -------------------------------------------------------------------
    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        assert self._scheduler is not None
        return self._scheduler.matched(request, num_computed_tokens), False

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        assert self._scheduler is not None
        self._scheduler.allocated(request, blocks.get_block_ids()[0], num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        assert self._scheduler is not None and self._kv_cache_manager is not None
        manager = self._kv_cache_manager

        def blocks_of(req_id: str) -> list[int]:
            return list(manager.get_block_ids(req_id)[0])

        plan = self._scheduler.step_plan(scheduler_output.num_scheduled_tokens, blocks_of)
        return StepMetadata(plan)

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        if self._scheduler is not None:
            self._scheduler.finished(request.request_id)
        return False, None

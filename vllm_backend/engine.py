"""vLLM's async engine in the worker's process (its ``AsyncLLM`` client; vLLM runs the
engine core and the model in processes of its own), with the worker's stat logger.

Lifecycle: :meth:`VllmEngine.start` (builds ``AsyncLLM`` from the engine arguments of
:func:`vllm_backend.args.engine_kwargs`: loads the model, sizes the KV cache, starts vLLM's
processes and through them the KV connector; tens of seconds) -> :meth:`VllmEngine.run`
per call -> :meth:`VllmEngine.shutdown`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from vllm import SamplingParams
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.inputs import TokensPrompt
from vllm.outputs import RequestOutput
from vllm.sampling_params import RequestOutputKind
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.metrics.loggers import StatLoggerBase

from vllm_backend.state import WorkerState

log = logging.getLogger(__name__)


def stat_logger(state: WorkerState) -> type[StatLoggerBase]:
    """A vLLM stat logger class that feeds ``state`` after every step."""

    class WorkerStats(StatLoggerBase):  # type: ignore[misc]
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            pass

        def record(
            self,
            scheduler_stats: Any,
            iteration_stats: Any,
            mm_cache_stats: Any = None,
            engine_idx: int = 0,
        ) -> None:
            s, it = scheduler_stats, iteration_stats
            if s is None and it is None:
                return
            state.record_step(
                now=time.monotonic(),
                running=s.num_running_reqs if s else state.running,
                waiting=s.num_waiting_reqs if s else state.waiting,
                usage=s.kv_cache_usage if s else state.usage,
                prompt_tokens=it.prompt_token_stats.computed if it else 0,
                output_tokens=it.num_generation_tokens if it else 0,
                preempted=it.num_preempted_reqs if it else 0,
                queue_times=[f.queued_time for f in it.finished_requests] if it else [],
            )

        def log_engine_initialized(self) -> None:
            pass

    return WorkerStats


class VllmEngine:
    """See the module docstring."""

    def __init__(self, llm: AsyncLLM) -> None:
        self.llm = llm
        self.total_pages = int(llm.vllm_config.cache_config.num_gpu_blocks or 0)

    @classmethod
    def start(cls, kwargs: dict[str, Any], state: WorkerState) -> VllmEngine:
        """vLLM's engine with ``kwargs`` as its arguments, feeding ``state``."""
        args = AsyncEngineArgs(**kwargs)
        llm = AsyncLLM.from_engine_args(args, stat_loggers=[stat_logger(state)])
        engine = cls(llm)
        state.total_pages = engine.total_pages
        log.info("vLLM engine up: %d KV pages", engine.total_pages)
        return engine

    async def run(
        self, request_id: str, tokens: Sequence[int], salt: str, sampling: dict[str, Any]
    ) -> AsyncIterator[RequestOutput]:
        """vLLM's outputs of one request (deltas: each output's tokens are new)."""
        params = SamplingParams(**sampling, output_kind=RequestOutputKind.DELTA)
        prompt = TokensPrompt(prompt_token_ids=list(tokens))
        if salt:
            prompt["cache_salt"] = salt
        async for out in self.llm.generate(prompt, params, request_id):
            yield out

    async def abort(self, request_ids: Sequence[str]) -> None:
        if request_ids:
            await self.llm.abort(list(request_ids))

    def shutdown(self) -> None:
        self.llm.shutdown()

"""Driving an engine to completion on the calling thread: offline use (``kvserve generate``,
warm-up, benchmarks, chaos checks) and tests. Nothing served uses it: a served engine is
stepped by :class:`workers.engine.loop.EngineLoop`.

Owns :class:`OfflineEngine`, what :func:`generate` drives: :class:`workers.engine.engine.Engine`
is one (and calls :func:`generate` from :meth:`~workers.engine.engine.Engine.generate`), so this
module imports no engine.
"""

from __future__ import annotations

from typing import Protocol

from workers.core.outputs import RequestOutput
from workers.core.sequence import SamplingParams


class Flushes(Protocol):
    """Queued pool writes that can be waited for
    (:class:`workers.handoff.prefill_side.PrefillHandoff`)."""

    def flush(self) -> None: ...


class OfflineEngine(Protocol):
    """What :func:`generate` uses of an engine: queue a request, run one step, and its step
    writer (the prefill half of the hand-off; None without a pool), flushed at the end."""

    @property
    def prefill(self) -> Flushes | None: ...

    def add_request(self, prompt_token_ids: list[int], params: SamplingParams) -> str: ...

    def step(self) -> list[RequestOutput]: ...


def generate(
    engine: OfflineEngine,
    prompts: list[list[int]],
    params: SamplingParams | list[SamplingParams],
) -> list[RequestOutput]:
    """Add ``prompts`` (one ``params`` for all, or one each) and step ``engine`` until all of
    them finished; their final outputs, in prompt order. Other requests the engine holds
    are stepped along. When it returns, the prompts' KV is published in the pool (queued
    writes flushed), so a later reader finds it. ``ValueError`` as
    :meth:`Engine.add_request <workers.engine.engine.Engine.add_request>` (the prompts before the
    refused one stay queued)."""
    plist = params if isinstance(params, list) else [params] * len(prompts)
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, plist, strict=True)]
    done: dict[str, RequestOutput] = {}
    while len(done) < len(ids):
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
    if engine.prefill is not None:
        engine.prefill.flush()
    return [done[i] for i in ids]

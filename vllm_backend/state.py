"""What a vLLM worker knows of its engine, for its replies and its load report.

Two feeds, both on the worker's event loop:

- the connector's reports (:mod:`vllm_backend.reports`, :meth:`WorkerState.handle`):
  whether vLLM's worker side joined the pool (``joined``); per request the prompt tokens
  planned from the pool (``admit``), the KV read (``load``) and written (``write``); the
  pool's counters and health (``pool``);
- vLLM's per-step stats (:meth:`WorkerState.record_step`, from the stat logger vLLM calls
  after each step: :mod:`vllm_backend.engine`): running and waiting requests, the share of
  KV pages in use, prompt and generated tokens, preemptions, queue times.

:meth:`WorkerState.load` is the snapshot the heartbeat, ``GetLoad`` and ``/metrics``
read (:class:`workers.core.engine_info.EngineLoad`, so our engine's load report and metrics
apply unchanged); another thread may take it (it copies).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

from kvpool.evictor import EvictionStats
from kvpool.stream import Transfer
from kvpool.tiers import TierStats
from workers.core.engine_info import EngineLoad, PoolHealth
from workers.core.outputs import EngineStats

BUSY_GAP_S = 1.0
"""Two stat records closer than this are consecutive steps (their gap: the step's time)."""


@dataclass
class RequestFacts:
    """What the connector reported of one request: the prompt tokens planned from the pool
    when vLLM admitted it (``planned``), and those that arrived verified (``pool_tokens``;
    what did not is recomputed)."""

    planned: int = 0
    pool_tokens: int | None = None
    read: Transfer = field(default_factory=Transfer)
    written: Transfer = field(default_factory=Transfer)
    admitted: asyncio.Event = field(default_factory=asyncio.Event)
    loaded: asyncio.Event = field(default_factory=asyncio.Event)


def pool_health(report: dict[str, Any]) -> PoolHealth:
    """A ``pool`` report's health, as our engine reports its own."""
    health = dict(report["health"])
    health["eviction"] = EvictionStats(**health["eviction"])
    health["tiers"] = TierStats(**health["tiers"])
    return PoolHealth(**health)


class WorkerState:
    """See the module docstring; ``total_pages`` is vLLM's KV cache size in pages."""

    def __init__(self, total_pages: int) -> None:
        self.total_pages = total_pages
        self.stats = EngineStats()
        self.running = self.waiting = 0
        self.usage = 0.0
        self.queued_prefill_tokens = 0
        self.pool = PoolHealth()
        self.facts: dict[str, RequestFacts] = {}
        self.pool_attached: bool | None = None
        """Whether vLLM's worker side joined the pool (``None``: not reported yet)."""
        self._joined = asyncio.Event()
        self._last_record: float | None = None

    async def joined(self, wait_s: float) -> bool:
        """Whether vLLM's worker side joined the pool: its ``joined`` report (sent when
        vLLM registered its caches, before the engine is up), waited for at most
        ``wait_s`` (none: not joined)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._joined.wait(), wait_s)
        return bool(self.pool_attached)

    def open(self, request_id: str) -> RequestFacts:
        """Start keeping the facts of ``request_id`` (until :meth:`forget`): reports of a
        request not open are counted in the totals only."""
        return self.facts.setdefault(request_id, RequestFacts())

    def handle(self, report: dict[str, Any]) -> None:
        """One connector report (:mod:`vllm_backend.reports`)."""
        kind = report["k"]
        if kind == "pool":
            self.pool = pool_health(report)
            return
        if kind == "joined":
            self.pool_attached = self.pool_attached is not False and bool(report["ok"])
            self._joined.set()
            return
        facts = self.facts.get(str(report["rid"]))
        if kind == "admit":
            if facts is not None:
                facts.planned = int(report["pool"])
                facts.admitted.set()
            return
        step = Transfer(int(report["bytes"]), float(report["seconds"]), float(report["exposed"]))
        if kind == "load":
            self.stats.kv_read.add(step)
            if facts is not None:
                facts.read.add(step)
                facts.pool_tokens = int(report["tokens"])
                facts.loaded.set()
        elif kind == "write":
            self.stats.kv_write.add(step)
            if facts is not None:
                facts.written.add(step)

    async def pool_tokens(self, request_id: str, wait_s: float) -> tuple[int, int]:
        """``(planned, arrived)``: the prompt tokens ``request_id`` was to take from the
        pool and those that arrived verified. Called at its first output: the ``admit``
        report was sent before the step that computed it and the ``load`` report (when it
        loaded anything) at the end of that step, on another socket than the output, so
        each is waited for, at most ``wait_s`` (then: what came; both 0 without either)."""
        facts = self.open(request_id)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(facts.admitted.wait(), wait_s)
            if facts.planned:
                await asyncio.wait_for(facts.loaded.wait(), wait_s)
        arrived = facts.planned if facts.pool_tokens is None else facts.pool_tokens
        return facts.planned, min(arrived, facts.planned)

    def forget(self, request_id: str) -> RequestFacts:
        return self.facts.pop(request_id, None) or RequestFacts()

    def record_step(
        self,
        now: float,
        running: int,
        waiting: int,
        usage: float,
        prompt_tokens: int,
        output_tokens: int,
        preempted: int,
        queue_times: list[float],
    ) -> None:
        """One step's stats (vLLM's stat logger)."""
        self.running, self.waiting, self.usage = running, waiting, usage
        gap = now - self._last_record if self._last_record is not None else BUSY_GAP_S
        self._last_record = now
        seconds = gap if gap < BUSY_GAP_S else 0.0
        self.stats.record_step(prompt_tokens > 0, output_tokens, seconds)
        self.stats.preemptions += preempted
        for waited in queue_times:
            self.stats.queue_time.observe(max(0.0, waited))

    def account(self, prompt: int, local: int, pool: int, output_tokens: int = 0) -> None:
        """A request's prompt (``local`` tokens from vLLM's own cache, ``pool`` from the
        pool, the rest computed) once its first token is out."""
        self.stats.requests += 1
        self.stats.prompt_tokens_cached += local + pool
        self.stats.prompt_tokens_from_pool += pool
        self.stats.prompt_tokens_computed += max(0, prompt - local - pool)

    def load(self, reserved: int, promised: int, idle: bool) -> EngineLoad:
        """The load snapshot (``reserved`` reservations of ``promised`` pages). ``idle``:
        the worker has no call open, so vLLM runs nothing and holds no page for a request
        (vLLM reports its stats after a step: after the last one, nothing runs to say so)."""
        used = 0 if idle else round(self.usage * self.total_pages)
        free = max(0, self.total_pages - used - promised)
        return EngineLoad(
            waiting=0 if idle else self.waiting,
            running=0 if idle else self.running,
            reserved=reserved,
            queued_prefill_tokens=self.queued_prefill_tokens,
            free_pages=free,
            total_pages=self.total_pages,
            stats=self.stats,
            pool=self.pool,
        )

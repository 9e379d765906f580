"""The simulated workers of the cluster replay (:mod:`kvserve.sim.trace.cluster`). Pure.

A :class:`SimWorker` is a prefill or decode worker reduced to what placement and prefix
hits depend on: the engine's own :class:`~workers.core.block_pool.BlockPool` (its local prefix
cache, or the one shared pool), the requests it holds pages for and until when, and the
load it reports (:meth:`SimWorker.load`). No model runs; time is the trace's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kvserve.sim.lru import leading
from router.placement.policies import WorkerLoad
from workers.core.block_pool import BlockPool

ROLES = ("prefill", "decode")


@dataclass
class SimWorker:
    """One worker: its page cache (possibly shared), what it holds and until when.

    ``role="prefill"``: one prefill at a time, FIFO (``busy_until`` is the end of its
    queue); its load counts one running request, the others waiting, and the queue's
    tokens at the modelled speed. ``role="decode"``: every request it holds decodes at
    once (all ``running``, none waiting, nothing queued)."""

    worker_id: str
    role: str
    pool: BlockPool
    busy_until: float = 0.0
    inflight: list[tuple[float, list[int]]] = field(default_factory=list)
    requests: int = 0
    peak_running: int = 0

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {self.role!r}")

    def release(self, now: float) -> None:
        """Free the pages of requests that finished by ``now`` (they stay cached), the
        earliest finished first, each tail-first as the engine frees them
        (:meth:`~workers.core.block_pool.BlockPool.free_chain`)."""
        done = [item for item in self.inflight if item[0] <= now]
        self.inflight = [item for item in self.inflight if item[0] > now]
        for _, pages in sorted(done, key=lambda item: item[0]):
            self.pool.free_chain(pages)

    def load(self, now: float, speed: float) -> WorkerLoad:
        """The report the router would have at ``now`` (after :meth:`release`);
        ``speed``: its prefill tokens/s."""
        busy = sum(1 for f, _ in self.inflight if f > now)
        running = min(busy, 1) if self.role == "prefill" else busy
        return WorkerLoad(
            worker_id=self.worker_id,
            role=self.role,
            waiting=busy - running,
            running=running,
            queued_prefill_tokens=int(max(0.0, self.busy_until - now) * speed),
            free_pages=self.pool.num_free,
            total_pages=self.pool.num_blocks,
            prefill_tokens_per_s=speed,
        )

    def hits(self, chain: Sequence[int]) -> int:
        """Leading blocks of ``chain`` its cache holds."""
        return leading(chain, lambda h: self.pool.lookup(h) is not None)

    def admit(self, chain: Sequence[int], hits: int) -> list[int]:
        """Take the cached leading pages, then fresh ones for the rest (as many as are free;
        blocks beyond that are computed but not cached); index the fresh ones, each with
        its parent in the chain (so the pool's KV events carry it)."""
        cached = [self.pool.lookup(h) for h in chain[:hits]]
        pages = [p for p in cached if p is not None]
        self.pool.touch(pages)
        fresh = self.pool.allocate(min(len(chain) - hits, self.pool.num_free))
        for i, page in enumerate(fresh, start=hits):
            self.pool.cache(page, chain[i], chain[i - 1] if i else 0)
        return pages + fresh

    def hold(self, pages: list[int], until: float, now: float) -> None:
        """Hold ``pages`` (one request's) until ``until``; count the request."""
        self.inflight.append((until, pages))
        self.requests += 1
        self.peak_running = max(self.peak_running, sum(1 for f, _ in self.inflight if f > now))

"""Prefill workers with local prefix caches against one shared cache, under the router's
real placement policies, replayed over a trace without running any model. Pure.

Each worker's cache is the engine's own :class:`~workers.block_pool.BlockPool` (refcounts,
LRU free list, hash index); placement is :mod:`router.conductor`'s ``Policy.place`` with the
loads of a simple queue model (see :func:`cluster_replay`). Block hashes and hit semantics
are those of :mod:`kvserve.bench.tracesim`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kvserve.bench.tracesim import HitCount, TraceRequest
from kvserve.sim.lru import leading
from router.conductor import PlacementRequest, WorkerLoad, make_policy
from workers.block_pool import BlockPool

HINT_SUFFIX = "+local_hints"
"""Policy-name suffix: the policy also sees each worker's local leading hits
(``PlacementRequest.local_tokens``) as the router would get from cache hints."""


@dataclass
class SimWorker:
    """One prefill worker: its page cache (possibly shared), its queue, what it holds."""

    worker_id: str
    pool: BlockPool
    busy_until: float = 0.0
    inflight: list[tuple[float, list[int]]] = field(default_factory=list)
    requests: int = 0

    def release(self, now: float) -> None:
        """Free the pages of requests that finished by ``now`` (they stay cached)."""
        done = [item for item in self.inflight if item[0] <= now]
        self.inflight = [item for item in self.inflight if item[0] > now]
        for _, pages in sorted(done, key=lambda item: item[0]):
            self.pool.free(pages)

    def load(self, now: float, speed: float) -> WorkerLoad:
        busy = [f for f, _ in self.inflight if f > now]
        running = 1 if busy else 0
        return WorkerLoad(
            worker_id=self.worker_id,
            role="prefill",
            waiting=len(busy) - running,
            running=running,
            queued_prefill_tokens=int(max(0.0, self.busy_until - now) * speed),
            free_pages=self.pool.num_free,
            total_pages=self.pool.num_blocks,
            prefill_tokens_per_s=speed,
        )

    def hits(self, chain: Sequence[int]) -> int:
        return leading(chain, lambda h: self.pool.lookup(h) is not None)

    def admit(self, chain: Sequence[int], hits: int) -> list[int]:
        """Take the cached leading pages, then fresh ones for the rest (as many as are free;
        blocks beyond that are computed but not cached); index the fresh ones."""
        cached = [self.pool.lookup(h) for h in chain[:hits]]
        pages = [p for p in cached if p is not None]
        self.pool.touch(pages)
        fresh = self.pool.allocate(min(len(chain) - hits, self.pool.num_free))
        for page, block_hash in zip(fresh, chain[hits:], strict=False):
            self.pool.cache(page, block_hash)
        return pages + fresh


@dataclass
class ClusterResult:
    """Hits, per-worker request counts and the modelled TTFTs of one cluster replay."""

    hits: HitCount
    per_worker: list[int]
    ttft_s: list[float]


def cluster_replay(
    requests: Sequence[TraceRequest],
    chains: Sequence[Sequence[int]],
    workers: int,
    capacity: int,
    policy: str,
    shared: bool,
    prefill_tokens_per_s: float,
    seed: int = 0,
) -> ClusterResult:
    """Place each request on one of ``workers`` prefill workers with the router's real
    ``policy`` (optionally suffixed :data:`HINT_SUFFIX`) and replay it there.

    ``shared=False``: each worker owns a :class:`BlockPool` of ``capacity // workers`` pages
    (its local prefix cache). ``shared=True``: all workers use one pool of ``capacity``
    pages (a global cache; its hits are the pool's ``pooled_tokens``).

    Queue model (no model runs): a worker prefills one request at a time at
    ``prefill_tokens_per_s``, only the uncached tokens; a request starts when it arrives
    (trace timestamp) or when its worker is free, and holds its pages (refcount) until its
    prefill ends, then frees them in chain order, so they stay cached as LRU. The loads
    the policy sees are those queues at arrival time.
    """
    base_policy = policy.removesuffix(HINT_SUFFIX)
    hinted = policy.endswith(HINT_SUFFIX)
    # threshold -1: every request goes to a prefill worker, even a fully cached one
    conductor = make_policy(base_policy, disagg_threshold_tokens=-1, seed=seed)
    common = BlockPool(capacity) if shared else None
    sims = [
        SimWorker(f"prefill-{i}", common or BlockPool(max(1, capacity // workers)))
        for i in range(workers)
    ]
    by_id = {w.worker_id: w for w in sims}
    decoder = WorkerLoad(worker_id="decode-0", role="decode")
    result = ClusterResult(HitCount(), [0] * workers, [])
    for request, chain in zip(requests, chains, strict=True):
        now = request.timestamp_ms / 1000.0
        for w in sims:
            w.release(now)
        weights = request.block_tokens()
        hit_tokens = {w.worker_id: sum(weights[: w.hits(chain)]) for w in sims}
        pooled = hit_tokens[sims[0].worker_id] if shared else 0
        placement_request = PlacementRequest(
            prompt_tokens=request.input_length,
            pooled_tokens=pooled,
            local_tokens=hit_tokens if hinted and not shared else {},
        )
        placement = conductor.place(
            placement_request, [w.load(now, prefill_tokens_per_s) for w in sims] + [decoder]
        )
        assert placement is not None and placement.prefill is not None, placement
        worker = by_id[placement.prefill]
        hits = worker.hits(chain)
        result.hits.add(request, hits)
        pages = worker.admit(chain, hits)
        start = max(now, worker.busy_until)
        worker.busy_until = start + (request.input_length - sum(weights[:hits])) / (
            prefill_tokens_per_s
        )
        worker.inflight.append((worker.busy_until, pages))
        worker.requests += 1
        result.ttft_s.append(worker.busy_until - now)
    result.per_worker = [w.requests for w in sims]
    return result

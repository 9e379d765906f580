"""KV between one engine's pages and the shared pool, around the model's steps.

Writing (every role that computes KV):

1. before a step runs, :meth:`KVStreamer.plan` names the blocks the step will complete
   (the scheduler's ``upcoming`` blocks) that the pool lacks, plus, for a request whose
   prefill ends in this step and is handed off to a decode worker, every full block of its
   prompt the pool lacks and its partial last block (request-scoped, under a lease);
2. while the model runs, :meth:`StepWrite.on_layer` is called after each layer: that
   layer's spans are put on a helper thread while the next layer computes (layer-wise
   streaming; with streaming off, nothing moves until the step ends);
3. after the step, :meth:`StepWrite.finish` waits for the last layers (from then on the
   pages may change hands) and queues the commit of the blocks' metas on the same helper
   thread: the next step computes meanwhile, and the blocks become visible as present a
   moment later (a decode worker waits for the metas anyway).

Reading (decode side, after a remote prefill): :func:`pull_prompt` fills a reservation's
pages with the prompt's blocks and its partial last block, verified, and says how many
prompt tokens are now computed; anything that fails is recomputed by the engine.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import NamedTuple

from kvpool.block_write import BlockWrite, PendingBlock
from kvpool.budget import PoolBudget
from kvpool.chain_index import ChainIndex
from kvpool.config import PoolConfig
from kvpool.hashing import Namespace
from kvpool.landing import Lander, Landing
from kvpool.layout import KVLayout
from kvpool.pool import KVPool, Lease
from kvpool.store import MooncakeStore, PoolUnavailableError
from workers.block_manager import BlockManager, NamedBlock
from workers.kv_cache import KVCache
from workers.kv_staging import TorchCopier, slots_for
from workers.scheduler import BatchEntry
from workers.sequence import Sequence

log = logging.getLogger(__name__)


def layout_of(kv: KVCache, dtype: str) -> KVLayout:
    """The wire layout of ``kv``'s slab (the contract between engine and pool)."""
    shape = kv.slab.shape
    return KVLayout(
        num_layers=shape[0],
        num_blocks=shape[1],
        block_tokens=shape[3],
        kv_heads=shape[4],
        head_dim=shape[5],
        dtype=dtype,
    )


def staged(config: PoolConfig, kv: KVCache) -> bool:
    """Whether ``kv`` moves through host staging slots (``--kv-staging``)."""
    on_host = kv.slab.device.type == "cpu"
    return config.kv_staging == "always" or (config.kv_staging == "auto" and not on_host)


def join_pool(
    config: PoolConfig,
    namespace: Namespace,
    kv: KVCache,
    dtype: str,
    block_key: bytes = b"",
    index: ChainIndex | None = None,
) -> KVPool | None:
    """Connect ``kv``'s slab to the shared pool, or ``None`` (logged) if it cannot be.

    A host-memory cache moves in place, one on a GPU through pinned staging slots, unless
    ``config.kv_staging`` says otherwise (:mod:`kvpool.span_io`). ``block_key``
    (``proto.trust.derive(secret, POOL_BLOCK)``) MACs and checks its blocks. With an
    ``index`` and ``pool_eviction=chain``, the pool evicts chain-aware through it, within
    ``pool_evict_at`` of the capacity the master reports (:mod:`kvpool.evictor`), unless
    it has an SSD tier (``pool_ssd_dir``), whose point is to keep what DRAM evicts: chain
    eviction removes blocks from every tier, so the master's eviction is used there."""
    try:
        store = MooncakeStore.connect(config)
    except PoolUnavailableError as exc:
        log.warning("running without the KV pool: %s", exc)
        return None
    on_host, layout = kv.slab.device.type == "cpu", layout_of(kv, dtype)
    memory: int | TorchCopier = kv.slab.data_ptr()
    if staged(config, kv) or not on_host:  # a device cache in place still digests on host
        slots = slots_for(config.kv_staging_mib, layout.span_bytes)
        memory = TorchCopier(kv.slab, slots, in_place=not staged(config, kv))
    writer = f"{socket.gethostname()}-{os.getpid()}-{id(kv):x}"
    try:
        ttl = config.pool_request_ttl_s
        pool = KVPool(store, namespace, layout, memory, writer, ttl, block_key)
    except PoolUnavailableError as exc:  # registering the memory failed
        log.warning("running without the KV pool: %s", exc)
        store.close()
        return None
    if index is not None and config.pool_eviction == "chain":
        if config.pool_ssd_dir:  # the tier holds what DRAM evicts: removing it defeats it
            log.warning("pool_eviction=chain is off with an SSD tier: the master evicts DRAM")
        else:
            budget = PoolBudget(config.metrics_url, config.pool_evict_at).start()
            pool.evict_through(index, budget)
    return pool


@dataclass
class Transfer:
    """KV moved for one request (or one step): bytes, time spent, time not hidden."""

    bytes: int = 0
    seconds: float = 0.0
    exposed_seconds: float = 0.0

    def add(self, other: Transfer) -> None:
        self.bytes += other.bytes
        self.seconds += other.seconds
        self.exposed_seconds += other.exposed_seconds


class StepWrite:
    """The pool writes of one step; see the module docstring for the order of calls."""

    def __init__(
        self,
        write: BlockWrite,
        executor: ThreadPoolExecutor | None,
        owners: dict[str, int],
        leases: list[Lease],
        in_flight: set[str] | None = None,
    ) -> None:
        self.write = write
        self.executor = executor
        self.in_flight = in_flight if in_flight is not None else set()
        """Meta keys whose commit is queued (shared with the streamer; read by ``plan``)."""
        self.owners = owners
        """request id -> how many of the step's blocks are its own (for attribution)."""
        self.leases = leases
        self._pending: list[Future[None]] = []

    def on_layer(self, layer: int) -> None:
        """Layer ``layer`` of the step is computed (its KV is in the pages)."""
        if self.executor is not None and self.write.blocks:
            after = self.write.pool.io.mark()  # on a GPU: the copy out waits for this layer
            self._pending.append(self.executor.submit(self.write.write_layer, layer, after))

    def finish(self) -> Transfer:
        """Wait for the layer puts and queue the commit (without streaming: write and commit
        everything now)."""
        t0 = time.perf_counter()
        for lease in self.leases:
            self.write.pool.lease(lease.request_id, lease.expires)
        if self.executor is None:
            self.write.write_all()
        else:
            for layer_write in self._pending:
                layer_write.result()
            if self.write.blocks:
                keys = {block.meta_key for block in self.write.blocks}
                self.in_flight.update(keys)
                commit = self.executor.submit(self.write.commit)
                commit.add_done_callback(lambda f: self._committed(f, keys))
        return Transfer(self.write.bytes, self.write.seconds, time.perf_counter() - t0)

    def abandon(self) -> None:
        """The step failed: wait for the layer puts already queued (the pages must not
        change hands under them) and commit nothing, so no block whose layers are incomplete
        ever becomes visible; the layers written stay invisible without their meta."""
        for layer_write in self._pending:
            try:
                layer_write.result()
            except Exception as exc:  # the step is lost anyway; the engine goes on
                log.warning("a KV layer write of a failed step failed too: %s", exc)

    def _committed(self, future: Future[int], keys: set[str]) -> None:
        self.in_flight.difference_update(keys)
        if (exc := future.exception()) is not None:
            log.error("committing KV blocks to the pool failed: %s", exc)


class WriteCandidate(NamedTuple):
    """A full block a step may write to the pool: the ``page`` it is read from, the
    request that owns the write (``owner``: the first that names the block in the step)
    and the block it extends (``None``: its chain's first)."""

    page: int
    owner: str
    parent: int | None


class KVStreamer:
    """Plans and runs one engine's pool writes. Lifecycle: construct -> per step
    ``plan`` -> ``on_layer``... -> ``finish`` -> :meth:`close` at shutdown."""

    def __init__(self, pool: KVPool, blocks: BlockManager, streaming: bool = True) -> None:
        self.pool = pool
        self.blocks = blocks
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="kv-write") if streaming else None
        self.in_flight: set[str] = set()
        """Meta keys of blocks whose layers are in and whose commit is queued: present in a
        moment, so never rewritten (nor their layers healed away) meanwhile."""

    def plan(self, entries: list[BatchEntry]) -> StepWrite:
        """The writes of a step that computes ``entries`` (the scheduler's batch)."""
        candidates: dict[int, WriteCandidate] = {}  # by block hash; the first one wins
        partials: list[PendingBlock] = []
        leases: list[Lease] = []
        owners: dict[str, int] = {}
        bt = self.blocks.block_tokens
        for seq, n in entries:
            named = self.blocks.upcoming(seq, n)
            parent = seq.block_hashes[-1] if seq.block_hashes else None
            if seq.handoff and seq.num_computed_tokens + n == seq.num_prompt_tokens:
                full = zip(seq.block_hashes, seq.block_table, strict=False)
                named, parent = [NamedBlock(h, p) for h, p in full] + named, None
                if tail := seq.num_prompt_tokens % bt:
                    page = seq.block_table[seq.num_prompt_tokens // bt]
                    block = self.pool.partial_block(seq.request_id, page, tail)
                    partials.append(block)
                    leases.append(Lease(block.expires, seq.request_id))
                    owners[seq.request_id] = 1
            for block_hash, page in named:
                if self.pool.keys.meta_key(block_hash) not in self.in_flight:
                    candidates.setdefault(block_hash, WriteCandidate(page, seq.request_id, parent))
                parent = block_hash
        hashes = list(candidates)
        admitted = self.pool.admit(hashes, [candidates[h].parent for h in hashes])
        todo: list[PendingBlock] = []
        absent = self.pool.absent(hashes)
        for block_hash, missing, ok in zip(hashes, absent, admitted, strict=True):
            if missing and ok:
                page, owner, _ = candidates[block_hash]
                todo.append(PendingBlock(self.pool.keys.meta_key(block_hash), page, {}))
                owners[owner] = owners.get(owner, 0) + 1
        indexed = frozenset(block.meta_key for block in todo)
        write = self.pool.begin_write(todo + partials, indexed)
        return StepWrite(write, self.executor, owners, leases, self.in_flight)

    def flush(self) -> None:
        """Wait until every queued write and commit is done (tests, shutdown)."""
        if self.executor is not None:
            self.executor.submit(lambda: None).result()

    def close(self) -> None:
        if self.executor is not None:
            self.executor.shutdown(wait=True)


class PromptTargets(NamedTuple):
    """What a reserved sequence needs from the pool: its full prompt ``blocks`` past its
    local hits, and the page of its partial last block (``None`` if it has none)."""

    blocks: list[NamedBlock]
    partial_page: int | None


def prompt_targets(blocks: BlockManager, seq: Sequence) -> PromptTargets:
    """The :class:`PromptTargets` of reserved ``seq``."""
    bt = blocks.block_tokens
    num_full = seq.num_prompt_tokens // bt
    named = blocks.upcoming(seq, num_full * bt - seq.num_computed_tokens)
    return PromptTargets(named, seq.block_table[num_full] if seq.num_prompt_tokens % bt else None)


def start_landing(
    pool: KVPool, lander: Lander, blocks: BlockManager, seq: Sequence, deadline: float
) -> Landing:
    """Begin pulling reserved ``seq``'s prompt KV as it lands (see :mod:`kvpool.landing`)."""
    named, partial = prompt_targets(blocks, seq)
    keys = [pool.keys.meta_key(block.hash) for block in named]
    pages = [block.page for block in named]
    if partial is not None:
        keys.append(pool.keys.request_key(seq.request_id))
        pages.append(partial)
    return lander.add(Landing(pool, keys, pages, deadline))


def pull_prompt(
    pool: KVPool, blocks: BlockManager, seq: Sequence, landing: Landing | None = None
) -> Transfer:
    """Fill reserved ``seq``'s pages past its local hits with its prompt's KV from the pool.

    ``seq`` holds pages for its whole prompt and has ``num_computed_tokens`` = its local
    hits. Without a ``landing`` the full blocks and then the partial last block are read
    now; with one, what it already pulled while the prefill ran is taken: the leading
    blocks it verified, whether it ended by itself or was cancelled (the caller waits for
    it while it makes progress, then cancels it: :meth:`kvpool.landing.Landing.settle`).
    Only leading verified blocks count, and the partial block only if every full block
    came. Advances ``num_computed_tokens`` and ``num_pool_tokens`` /
    ``num_cached_tokens`` by what arrived; the rest is left for the engine to compute.
    """
    t0 = time.perf_counter()
    read0 = pool.stats.bytes_read
    tail = seq.num_prompt_tokens % blocks.block_tokens
    named, partial_page = prompt_targets(blocks, seq)
    partial: int | None = None
    if landing is None:
        hashes, pages = [b.hash for b in named], [b.page for b in named]
        loaded = pool.load(hashes, pages, seq.block_hashes) if named else 0
        if partial_page is not None and loaded == len(named):
            partial = pool.take_partial(seq.request_id, partial_page)
    else:
        metas = landing.wait(0.0)
        loaded = min(len(metas), len(named))
        if partial_page is not None and len(metas) == len(named) + 1:
            partial = metas[len(named)].tokens
    if partial_page is not None and (partial is None or landing is not None):
        pool.drop_partial(seq.request_id)  # (take_partial already removed it)
    credit_prompt(seq, loaded * blocks.block_tokens + (tail if partial == tail else 0))
    seconds = time.perf_counter() - t0
    if landing is None:
        return Transfer(pool.stats.bytes_read - read0, seconds, seconds)
    return Transfer(landing.bytes, landing.read_seconds, seconds)


def credit_prompt(seq: Sequence, tokens: int) -> None:
    """Count ``tokens`` prompt tokens of reserved ``seq``, past its local hits, as arrived
    from elsewhere (the pool, or a direct push): computed, cached, from the pool."""
    seq.num_pool_tokens = tokens
    seq.num_computed_tokens += tokens
    seq.num_cached_tokens += tokens

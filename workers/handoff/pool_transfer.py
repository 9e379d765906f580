"""KV between one engine's pages and the shared pool, around the model's steps.

Writing (every role that computes KV): :class:`KVStreamer` turns each step's batch into
:class:`kvpool.stream.WriteIntent` s (the scheduler's ``upcoming`` blocks; for a request
whose prefill ends in this step and is handed off to a decode worker, every full block of
its prompt and its partial last block, request-scoped under a lease) and runs them as
:mod:`kvpool.stream` describes: planned before the step, each layer put while the next one
computes, the metas committed on the helper thread after the step (the next step computes
meanwhile; a decode worker waits for the metas anyway).

Reading (decode side, after a remote prefill): :func:`pull_prompt` fills a reservation's
pages with the prompt's blocks and its partial last block, verified, and says how many
prompt tokens are now computed; anything that fails is recomputed by the engine.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import NamedTuple

from kvpool.budget import PoolBudget
from kvpool.chain_index import ChainIndex
from kvpool.config import PoolConfig
from kvpool.hashing import Namespace
from kvpool.landing import Lander, Landing
from kvpool.layout import KVLayout
from kvpool.pool import KVPool
from kvpool.store import MooncakeStore, PoolUnavailableError
from kvpool.stream import StepWrite, StreamWriter, Transfer, WriteIntent
from proto.registry import ClusterConfig, connect
from workers.core.block_manager import BlockManager, NamedBlock
from workers.core.kv_cache import KVCache
from workers.core.scheduler import BatchEntry
from workers.core.sequence import Sequence
from workers.handoff.staging import SlabViews, TorchCopier, slots_for

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
    ``config.kv_staging`` says otherwise (:mod:`kvpool.span_io`). The rest is
    :func:`pool_over`."""
    on_host, layout = kv.slab.device.type == "cpu", layout_of(kv, dtype)
    memory: int | TorchCopier = kv.slab.data_ptr()
    if staged(config, kv) or not on_host:  # a device cache in place still digests on host
        slots = slots_for(config.kv_staging_mib, layout.span_bytes)
        memory = TorchCopier(SlabViews(kv.slab), slots, in_place=not staged(config, kv))
    writer = f"{socket.gethostname()}-{os.getpid()}-{id(kv):x}"
    return pool_over(config, namespace, layout, memory, writer, block_key, index)


INDEX_TIMEOUT_S = 1.0
"""The longest a chain-index call may hold the engine thread (a frozen Redis)."""


def pool_index(cluster: ClusterConfig) -> ChainIndex:
    """The pool's chain index in the cluster's Redis (chain-aware eviction), under the
    cluster's key prefix."""
    client = connect(cluster, INDEX_TIMEOUT_S, INDEX_TIMEOUT_S, retry=False)
    return ChainIndex(client, f"{cluster.cluster}:pool")


def pool_over(
    config: PoolConfig,
    namespace: Namespace,
    layout: KVLayout,
    memory: int | TorchCopier,
    writer: str,
    block_key: bytes = b"",
    index: ChainIndex | None = None,
) -> KVPool | None:
    """Join the pool with a KV cache of ``layout`` at ``memory`` (a host slab's address,
    or a copier: :class:`kvpool.pool.KVPool`), or ``None`` (logged) if it cannot be done.
    ``block_key`` (``proto.trust.derive(secret, POOL_BLOCK)``) MACs and checks its blocks;
    ``writer`` names it in the metas it writes. With an ``index`` and
    ``pool_eviction=chain``, the pool evicts chain-aware through it, within
    ``pool_evict_at`` of the capacity the master reports (:mod:`kvpool.evictor`), unless
    it has an SSD tier (``pool_ssd_dir``), whose point is to keep what DRAM evicts: chain
    eviction removes blocks from every tier, so the master's eviction is used there."""
    try:
        store = MooncakeStore.connect(config)
    except PoolUnavailableError as exc:
        log.warning("running without the KV pool: %s", exc)
        return None
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


class KVStreamer(StreamWriter):
    """Plans and runs one engine's pool writes (:class:`kvpool.stream.StreamWriter`) from
    the scheduler's batches. Lifecycle: construct -> per step ``plan`` -> ``on_layer``...
    -> ``finish`` -> :meth:`close` at shutdown."""

    def __init__(self, pool: KVPool, blocks: BlockManager, streaming: bool = True) -> None:
        super().__init__(pool, streaming)
        self.blocks = blocks

    def plan(self, entries: list[BatchEntry]) -> StepWrite:
        """The writes of a step that computes ``entries`` (the scheduler's batch): each
        request's blocks the step completes; for a hand-off prompt whose prefill ends in
        the step, every full block of it and its partial last block."""
        intents: list[WriteIntent] = []
        bt = self.blocks.block_tokens
        for seq, n in entries:
            named = [(b.hash, b.page) for b in self.blocks.upcoming(seq, n)]
            parent = seq.block_hashes[-1] if seq.block_hashes else None
            partial: tuple[int, int] | None = None
            if seq.handoff and seq.num_computed_tokens + n == seq.num_prompt_tokens:
                full = list(zip(seq.block_hashes, seq.block_table, strict=False))
                named, parent = full + named, None
                if tail := seq.num_prompt_tokens % bt:
                    partial = (seq.block_table[seq.num_prompt_tokens // bt], tail)
            intents.append(WriteIntent(seq.request_id, named, parent, partial))
        return self.plan_writes(intents)


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
            partial = pool.partials.take(seq.request_id, partial_page)
    else:
        metas = landing.wait(0.0)
        loaded = min(len(metas), len(named))
        if partial_page is not None and len(metas) == len(named) + 1:
            partial = metas[len(named)].tokens
    if partial_page is not None and (partial is None or landing is not None):
        pool.partials.drop(seq.request_id)  # (take already removed it)
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

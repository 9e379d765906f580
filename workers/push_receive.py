"""Decode side of a direct push: where a reservation's pages are, and what of them to believe.

1. :func:`push_target`, at ``Reserve`` time (engine thread): the reserved pages past the
   local prefix hits, as a :class:`kvpool.push.PushTarget` (this worker's pool segment, its
   slab's address and layout, one page per prompt block from the first one not cached
   here). Only a KV cache the pool moves in place (:class:`kvpool.span_io.DirectIO`) can be
   written directly; otherwise there is no target and the router uses the pool.
2. The prefill worker writes the pages; nothing here sees the writes happen.
3. :func:`take_pushed`, at adoption (engine thread, after the prefill answered, so no write
   is still coming): each block of the reservation, in order, is believed only if the meta
   the prefill worker sent for it (relayed by the router) is MAC'd under the pool block key
   *for the name this worker computes for that block itself* (:mod:`kvpool.meta`), and the
   digests of this worker's own page match the meta's. The first block that fails ends the
   run: it and every later one are recomputed. Nothing in a meta chooses a page or a name.
"""

from __future__ import annotations

import time
from collections.abc import Sequence as Seq
from typing import NamedTuple

from kvpool.meta import BlockMeta, MetaFault
from kvpool.pool import KVPool
from kvpool.push import PushTarget
from kvpool.span_io import DirectIO
from workers.block_manager import BlockManager
from workers.kv_transfer import Transfer, credit_prompt, prompt_targets
from workers.sequence import Sequence


class PushedBlocks(NamedTuple):
    """The blocks of a reservation a push fills: the pool names (``meta_keys``: full blocks
    by prefix hash, the partial last block by request key) and the ``pages`` they go to."""

    meta_keys: list[str]
    pages: list[int]
    partial_tokens: int
    """Valid tokens of the partial last block (0: the prompt ends on a block boundary)."""


def pushed_blocks(pool: KVPool, blocks: BlockManager, seq: Sequence) -> PushedBlocks | None:
    """What a push into reserved ``seq`` fills (``None`` when the blocks cannot be named:
    prefix caching off)."""
    bt = blocks.block_tokens
    named, partial = prompt_targets(blocks, seq)
    if len(named) != seq.num_prompt_tokens // bt - seq.num_computed_tokens // bt:
        return None
    keys = [pool.keys.meta_key(block.hash) for block in named]
    pages = [block.page for block in named]
    if partial is not None:
        keys.append(pool.keys.request_key(seq.request_id))
        pages.append(partial)
    return PushedBlocks(keys, pages, seq.num_prompt_tokens % bt)


def push_target(
    pool: KVPool, blocks: BlockManager, seq: Sequence, lease_s: float
) -> PushTarget | None:
    """Where a prefill worker may push reserved ``seq``'s prompt KV (module docstring), or
    ``None`` when it cannot be pushed here."""
    if not isinstance(pool.io, DirectIO) or seq.num_computed_tokens >= seq.num_prompt_tokens:
        return None
    fills = pushed_blocks(pool, blocks, seq)
    if fills is None or not fills.pages:
        return None
    return PushTarget(
        segment=pool.store.segment(),
        wire=pool.layout.wire,
        slab_address=pool.slab_ptr,
        num_blocks=pool.layout.num_blocks,
        first_block=seq.num_computed_tokens // blocks.block_tokens,
        pages=tuple(fills.pages),
        lease_s=lease_s,
    )


def _verified(pool: KVPool, meta_key: str, page: int, raw: bytes) -> BlockMeta | None:
    """The meta ``raw`` of block ``meta_key`` if its MAC verifies and ``page`` matches its
    digests (a failure is counted: forged, bad, or a checksum failure)."""
    meta = pool.codec.decode(raw, meta_key)
    if meta is MetaFault.FORGED:
        pool.stats.forged_blocks += 1  # (nothing to heal: it is not in the pool)
    elif meta is MetaFault.BAD:
        pool.stats.bad_meta += 1
    if not isinstance(meta, BlockMeta):
        return None
    layout = pool.layout
    size = layout.span_bytes
    sums = [
        pool.digest(pool.slab_ptr + layout.offset(layer, page), size)
        for layer in range(layout.num_layers)
    ]
    if sums != meta.sums:
        pool.stats.checksum_failures += 1
        return None
    return meta


def take_pushed(pool: KVPool, blocks: BlockManager, seq: Sequence, metas: Seq[bytes]) -> Transfer:
    """Believe the leading blocks of reserved ``seq`` whose pushed pages verify against
    ``metas`` (module docstring) and credit their tokens (:func:`credit_prompt`); the rest
    is left for the engine to compute. The transfer's time is the verification (all of it
    exposed: the writes themselves were the prefill worker's)."""
    t0 = time.perf_counter()
    fills = pushed_blocks(pool, blocks, seq)
    tokens = verified = 0
    if fills is not None and len(metas) == len(fills.meta_keys):
        last = len(fills.meta_keys) - 1
        for i, (key, page, raw) in enumerate(zip(fills.meta_keys, fills.pages, metas, strict=True)):
            meta = _verified(pool, key, page, raw)
            partial = i == last and fills.partial_tokens > 0
            if meta is None or (partial and meta.tokens != fills.partial_tokens):
                break
            verified += 1
            tokens += fills.partial_tokens if partial else blocks.block_tokens
    credit_prompt(seq, tokens)
    seconds = time.perf_counter() - t0
    nbytes = verified * pool.layout.num_layers * pool.layout.span_bytes
    return Transfer(nbytes, seconds, seconds)

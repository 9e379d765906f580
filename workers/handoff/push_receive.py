"""Decode side of a direct push: where a reservation's pages are, and what of them to believe.

1. :func:`push_target`, at ``Reserve`` time (engine thread): the reserved pages past the
   local prefix hits, as a :class:`kvpool.push.PushTarget` (this worker's pool segment, its
   slab's address and layout, one page per prompt block from the first one not cached
   here), MAC'd for the request under the pool block key. Only a KV cache the pool moves
   in place (:class:`kvpool.span_io.DirectIO`) can be written directly; otherwise there is
   no target and the router uses the pool.
2. The prefill worker writes the pages; nothing here sees the writes happen. But it
   publishes each step's full blocks to the pool once their pushes are done, so a
   :class:`PushWatch` (on the lander thread) verifies the leading full blocks while the
   prefill still runs: a page that matches its block's pool meta (MAC'd for the name this
   worker computes) holds that block's KV, whoever wrote the meta.
3. After the prefill answered (no write is still coming), :func:`push_check` (engine
   thread) ends the watch and names what is left to check (the last step's blocks, as a
   rule), and :meth:`PushCheck.run` checks it off the engine thread
   (it only reads the pages; digests on :data:`VERIFY_THREADS` threads): each block of the
   reservation, in order, is believed only if the meta the prefill worker sent for it
   (relayed by the router) is MAC'd under the pool block key *for the name this worker
   computes for that block itself* (:mod:`kvpool.meta`), and the digests of this worker's
   own page match the meta's. The first block that fails ends the run: it and every later
   one are recomputed. Nothing in a meta chooses a page or a name.
4. :func:`take_pushed`, at adoption (engine thread): the verdict credited to the very
   reservation it was made for.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Sequence as Seq
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import NamedTuple

from kvpool.landing import Landing
from kvpool.meta import BlockMeta, MetaFault
from kvpool.pool import KVPool
from kvpool.push import PushTarget, target_mac, time_ms
from kvpool.span_io import DirectIO
from kvpool.stream import Transfer
from workers.core.block_manager import BlockManager
from workers.core.sequence import Sequence
from workers.handoff.pool_transfer import credit_prompt, prompt_targets


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
    target = PushTarget(
        segment=pool.store.segment(),
        wire=pool.layout.wire,
        slab_address=pool.slab_ptr,
        num_blocks=pool.layout.num_blocks,
        first_block=seq.num_computed_tokens // blocks.block_tokens,
        pages=tuple(fills.pages),
        lease_s=lease_s,
        issued_ms=time_ms(),
    )
    mac = target_mac(pool.keys.block_key, seq.request_id, target)
    return dataclasses.replace(target, mac=mac)


VERIFY_THREADS = max(1, min(4, os.cpu_count() or 1))
"""Threads digesting a push's pages (SHA-256 and xxh3 release the GIL over large spans)."""


class PushVerdict(NamedTuple):
    """What :meth:`PushCheck.run` found for reservation ``seq``: ``tokens`` prompt tokens
    (leading blocks) verified, their ``bytes``, and the ``seconds`` the check took."""

    seq: Sequence
    tokens: int
    bytes: int
    seconds: float


def page_digests(pool: KVPool, page: int) -> list[bytes]:
    """The layer digests of ``page`` of ``pool``'s slab (host memory, in place)."""
    layout, size, base = pool.layout, pool.layout.span_bytes, pool.slab_ptr
    return [
        pool.digest(base + layout.offset(layer, page), size) for layer in range(layout.num_layers)
    ]


@dataclass(frozen=True)
class PushCheck:
    """The check of one push reservation's pages against the pushed metas (module
    docstring, step 3). Made on the engine thread; :meth:`run` on any thread. The first
    ``skip`` blocks were verified already, while the prefill ran (:class:`PushWatch`)."""

    pool: KVPool
    seq: Sequence
    fills: PushedBlocks
    block_tokens: int
    skip: int = 0

    def _digests(self, page: int) -> list[bytes]:
        return page_digests(self.pool, page)

    def _meta(self, meta_key: str, raw: bytes) -> BlockMeta | None:
        """The meta ``raw`` of block ``meta_key`` if its MAC verifies (failures counted)."""
        meta = self.pool.codec.decode(raw, meta_key)
        if meta is MetaFault.FORGED:
            self.pool.stats.forged_blocks += 1  # (nothing to heal: it is not in the pool)
        elif meta is MetaFault.BAD:
            self.pool.stats.bad_meta += 1
        return meta if isinstance(meta, BlockMeta) else None

    def run(self, metas: Seq[bytes]) -> PushVerdict:
        """The leading blocks whose metas verify and whose pages match them."""
        t0 = time.perf_counter()
        fills, skip = self.fills, self.skip
        verified, tokens = skip, skip * self.block_tokens
        if len(metas) == len(fills.meta_keys):
            checked: list[BlockMeta] = []
            for key, raw in zip(fills.meta_keys[skip:], metas[skip:], strict=True):
                if (meta := self._meta(key, raw)) is None:
                    break
                checked.append(meta)
            with ThreadPoolExecutor(VERIFY_THREADS, thread_name_prefix="push-check") as pool:
                sums = list(pool.map(self._digests, fills.pages[skip : skip + len(checked)]))
            last = len(fills.meta_keys) - 1
            for i, (meta, got) in enumerate(zip(checked, sums, strict=True), start=skip):
                if got != meta.sums:
                    self.pool.stats.checksum_failures += 1
                    break
                partial = i == last and fills.partial_tokens > 0
                if partial and meta.tokens != fills.partial_tokens:
                    break
                verified += 1
                tokens += fills.partial_tokens if partial else self.block_tokens
        nbytes = verified * self.pool.layout.num_layers * self.pool.layout.span_bytes
        return PushVerdict(self.seq, tokens, nbytes, time.perf_counter() - t0)


def push_check(
    pool: KVPool, blocks: BlockManager, seq: Sequence, skip: int = 0
) -> PushCheck | None:
    """The check of reserved ``seq``'s pushed pages past its first ``skip`` blocks, verified
    already (``None``: they cannot be named)."""
    fills = pushed_blocks(pool, blocks, seq)
    return None if fills is None else PushCheck(pool, seq, fills, blocks.block_tokens, skip)


class PushWatch(Landing):
    """Verifies a push reservation's full blocks while the prefill still runs (stepped by
    the decode worker's :class:`~kvpool.landing.Lander` thread, as a landing is).

    The prefill worker publishes a step's blocks to the pool only after that step's pushes
    are done (:mod:`workers.handoff.pusher`). So once a block's meta is in the pool and verifies
    (its MAC, for the name this worker computes), a page that matches its digests holds
    that block's KV, whoever wrote the meta: ``count`` leading blocks are then verified,
    and the check at adoption (:class:`PushCheck` with ``skip``) digests only the rest
    (the last step's blocks, whose metas come with the prefill's answer). A page that does
    not match yet (its push has not landed) is tried again next round; a meta that does
    not verify ends the watch. Reads nothing into the pages. Ends at its ``deadline``,
    while the pool is out, when every full block is verified, or cancelled."""

    def __init__(self, pool: KVPool, fills: PushedBlocks, deadline: float) -> None:
        full = len(fills.meta_keys) - (1 if fills.partial_tokens else 0)
        super().__init__(pool, fills.meta_keys[:full], fills.pages[:full], deadline)
        self.pending = []
        self.count = 0
        """Leading blocks verified so far (final once the watch is cancelled or over)."""

    def step(self) -> bool:
        self.progressed = False
        if time.monotonic() > self.deadline or not self.pool.store.available:
            self.over = True
            return True
        start = self.count
        keys = self.meta_keys[start : start + WATCH_WINDOW]
        for i, raw in enumerate(self.pool.store.get_bytes(keys), start=start):
            if not raw:
                break
            meta = self.pool.codec.decode(raw, self.meta_keys[i])
            if not isinstance(meta, BlockMeta):
                self.over = True  # the pushed metas decide at adoption
                return True
            if page_digests(self.pool, self.pages[i]) != meta.sums:
                break  # not landed yet
            self.count += 1
            self._progress()
        self.over = self.count == len(self.meta_keys)
        return self.over

    def finish(self) -> None:
        self.over = True


WATCH_WINDOW = 64
"""Block metas a :class:`PushWatch` asks the pool for per round."""


def take_pushed(seq: Sequence, verdict: PushVerdict) -> Transfer:
    """Credit ``verdict``'s tokens to reserved ``seq`` (:func:`credit_prompt`; nothing if
    the verdict was for another reservation); the rest is left for the engine to compute.
    The transfer's time is the check (all of it exposed: the writes were the prefill
    worker's)."""
    mine = verdict.seq is seq
    credit_prompt(seq, verdict.tokens if mine else 0)
    nbytes = verdict.bytes if mine else 0
    return Transfer(nbytes, verdict.seconds, verdict.seconds)

"""Pages per sequence: allocation in block units, the local prefix cache, release.

Pure bookkeeping over :class:`~workers.core.block_pool.BlockPool`. The scheduler speaks tokens;
this layer turns them into pages:

- :meth:`BlockManager.match_prefix` finds the longest run of a waiting sequence's full blocks
  already cached here (never the whole prompt: the last token is always computed so the
  model yields logits to sample from);
- :meth:`BlockManager.can_allocate` / :meth:`BlockManager.allocate` grow a sequence's block
  table to cover ``num_new_tokens`` more tokens (prefix hits are taken in the same call);
- :meth:`BlockManager.pull_remote` copies a waiting sequence's further prefix blocks from a
  :class:`RemotePrefix` into free pages and indexes them, so they become ordinary local hits;
- :meth:`BlockManager.upcoming` names the blocks a step will fill, before it runs (so they
  can be streamed to the pool layer by layer); :meth:`BlockManager.commit` indexes the
  blocks that became full after a step, so later requests can hit them;
- :meth:`BlockManager.deallocate` gives every page back (finish, abort, preemption).
"""

from __future__ import annotations

from collections import abc
from typing import NamedTuple, Protocol

from kvpool.hashing import PrefixHasher
from workers.core.block_pool import BlockPool
from workers.core.sequence import Sequence


class PrefixHit(NamedTuple):
    """A sequence's longest locally cached prefix: its ``pages`` and their block names
    (``hashes``), in order; both empty when nothing is cached."""

    pages: list[int]
    hashes: list[int]


class NamedBlock(NamedTuple):
    """One full block of a sequence: its name (``hash``, a link of the prefix chain) and
    the ``page`` that holds (or will hold) its KV."""

    hash: int
    page: int


class RemotePrefix(Protocol):
    """A shared prefix cache beyond this engine (the KV pool): who to ask for more hits.

    ``lookup`` says how many leading blocks of a hash chain it has; ``load`` copies the
    leading blocks into the given pages and returns how many it verified (``prefix``: the
    chain's blocks before them, held here, which a hit refreshes too).
    """

    def lookup(self, hashes: list[int]) -> int: ...

    def load(self, hashes: list[int], pages: list[int], prefix: abc.Sequence[int] = ()) -> int: ...


class BlockManager:
    """Pages of ``num_blocks`` pages of ``block_tokens`` tokens; blocks are named by
    ``hasher`` (the cluster's keyed prefix chain), from each sequence's ``hash_root``."""

    def __init__(
        self,
        num_blocks: int,
        block_tokens: int,
        hasher: PrefixHasher,
        prefix_caching: bool = True,
    ) -> None:
        self.pool = BlockPool(num_blocks)
        self.block_tokens = block_tokens
        self.hasher = hasher
        self.prefix_caching = prefix_caching

    def root(self, seq: Sequence) -> int:
        """The parent of ``seq``'s first block name: its cache salt's root, or the unsalted
        one."""
        return self.hasher.unsalted_root if seq.hash_root is None else seq.hash_root

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_tokens)

    @property
    def num_free(self) -> int:
        """Pages free now (cached ones with no reference included)."""
        return self.pool.num_free

    def match_prefix(self, seq: Sequence) -> PrefixHit:
        """``seq``'s longest cached prefix (none when it does not reuse prefixes:
        :attr:`Sequence.reuses_prefix`); nothing is taken yet."""
        if not self.prefix_caching or not seq.reuses_prefix:
            return PrefixHit([], [])
        blocks: list[int] = []
        hashes: list[int] = []
        parent = self.root(seq)
        bt = self.block_tokens
        for start in range(0, seq.num_tokens - 1 - bt + 1, bt):
            parent = self.hasher.block(parent, seq.token_ids[start : start + bt])
            block = self.pool.lookup(parent)
            if block is None:
                break
            blocks.append(block)
            hashes.append(parent)
        return PrefixHit(blocks, hashes)

    def _pages_needed(self, seq: Sequence, num_new_tokens: int, hits: list[int]) -> int:
        covered = len(seq.block_table) + len(hits)
        computed = seq.num_computed_tokens + len(hits) * self.block_tokens
        new = max(0, self.blocks_for(computed + num_new_tokens) - covered)
        revived = sum(1 for b in hits if self.pool.ref_counts[b] == 0)
        return new + revived

    def can_allocate(
        self, seq: Sequence, num_new_tokens: int, hits: list[int] | None = None
    ) -> bool:
        """Whether ``num_new_tokens`` more tokens (after prefix ``hits``) fit right now."""
        return self.pool.can_allocate(self._pages_needed(seq, num_new_tokens, hits or []))

    def allocate(
        self,
        seq: Sequence,
        num_new_tokens: int,
        hits: PrefixHit | None = None,
    ) -> None:
        """Take prefix ``hits`` then fresh pages for ``num_new_tokens``.

        Hits are only valid on a sequence with nothing computed; they advance
        ``num_computed_tokens`` and ``num_cached_tokens``. Callers check
        :meth:`can_allocate` first; running out here is a bug.
        """
        if hits and hits.pages:
            assert seq.num_computed_tokens == 0 and not seq.block_table
            pages, hashes = hits
            self.pool.touch(pages)
            seq.block_table.extend(pages)
            seq.block_hashes.extend(hashes)
            seq.num_computed_tokens = seq.num_cached_tokens = len(pages) * self.block_tokens
        need = self.blocks_for(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
        if need > 0:
            seq.block_table.extend(self.pool.allocate(need))

    def upcoming(self, seq: Sequence, num_new_tokens: int) -> list[NamedBlock]:
        """The blocks of ``seq`` that will be full and computed once
        ``num_new_tokens`` more tokens are; nothing changes (used to stream them to the pool
        while the step runs)."""
        if not self.prefix_caching:
            return []
        bt = self.block_tokens
        full = min(seq.num_computed_tokens + num_new_tokens, seq.num_tokens) // bt
        parent = seq.block_hashes[-1] if seq.block_hashes else self.root(seq)
        named: list[NamedBlock] = []
        for i in range(len(seq.block_hashes), full):
            parent = self.hasher.block(parent, seq.token_ids[i * bt : (i + 1) * bt])
            named.append(NamedBlock(parent, seq.block_table[i]))
        return named

    def commit(self, seq: Sequence, share: bool = False) -> list[NamedBlock]:
        """Hash and index the blocks of ``seq`` that are full and computed.

        With ``share``, a block whose hash another page already holds moves onto that page
        (one more reference) and gives its own page back, so that concurrent requests over
        one prefix read one copy (memory, and the bandwidth of every decode step). Only for
        a sequence whose pages nothing writes or reads behind the engine's back any more (a
        decode worker's adopted reservation, its landing stopped): the engine thread's own
        steps stream freshly computed pages to the pool while they run. Returns the newly
        named blocks, with the pages ``seq`` holds now.
        """
        named = self.upcoming(seq, 0)
        first, epoch = len(seq.block_hashes), seq.page_epoch
        parent = seq.block_hashes[-1] if seq.block_hashes else self.root(seq)
        for i, (block_hash, page) in enumerate(named):
            other = self.pool.lookup(block_hash) if share else None
            if other is not None and other != page:
                self.pool.touch([other])
                self.pool.free([page])
                seq.block_table[first + i] = other
                seq.page_epoch = epoch + 1  # its block-table row is written anew
                named[i] = NamedBlock(block_hash, other)
                page = other
            seq.block_hashes.append(block_hash)
            self.pool.cache(page, block_hash, parent)
            parent = block_hash
        return named

    def pull_remote(self, seq: Sequence, remote: RemotePrefix) -> int:
        """Load the blocks of waiting ``seq`` that follow its local hits from ``remote``.

        The loaded pages are indexed in the local prefix cache and left free (refcount 0),
        so the next :meth:`match_prefix` takes them like any local hit. Returns the number of
        blocks loaded. Never takes more pages than are free.
        """
        if not self.prefix_caching or seq.num_computed_tokens or not seq.reuses_prefix:
            return 0
        hashes = self.hasher.chain(
            seq.token_ids[: seq.num_tokens - 1], self.block_tokens, self.root(seq)
        )
        local = next((i for i, h in enumerate(hashes) if self.pool.lookup(h) is None), len(hashes))
        wanted = hashes[local:]
        if not wanted:
            return 0
        n = min(remote.lookup(wanted), self.pool.num_free)
        if n == 0:
            return 0
        pages = self.pool.allocate(n)
        loaded = remote.load(wanted[:n], pages, hashes[:local])
        parents = [hashes[local - 1] if local else self.root(seq), *wanted]
        for h, parent, page in zip(wanted[:loaded], parents, pages, strict=False):
            self.pool.cache(page, h, parent)
        self.pool.free_chain(pages)
        return loaded

    def deallocate(self, seq: Sequence) -> None:
        """Give back every page of ``seq``; the last block goes to the free list first,
        so a shared prefix outlives its tail under eviction."""
        self.pool.free_chain(seq.block_table)
        seq.block_table.clear()
        seq.page_epoch += 1
        seq.block_hashes.clear()
        seq.num_computed_tokens = 0

"""Chain-aware eviction of the pool: one writer's or reader's side of
:class:`kvpool.chain_index.ChainIndex`.

The pool is kept under a byte budget by its users instead of by the master (whose own
eviction, from its high watermark in lease order, stays as the backstop): before a writer
puts blocks it claims them in the shared index, which evicts the least recently used
chain tails (leaves first) over the budget; the writer removes the victims' objects (meta
first, so no reader starts on a block being removed), then writes. A read refreshes the
blocks it loaded (and so, leaves first, every block they extend).

Lifecycle of :class:`ChainEvictor`: construct over a store, key space and index ->
:meth:`admit` before each write, :meth:`settle` after its commit, :meth:`touch` after each
hit, :meth:`forget` for a block removed as bad -> :meth:`close` (stops a
:class:`~kvpool.budget.PoolBudget`; the index lives on in Redis). ``budget`` is called on
every :meth:`admit`: the bytes the pool may hold now, or ``None`` when unknown (then
nothing is evicted here). Thread-safe where its store is (calls are independent).

The index is an aid, never a dependency: when Redis fails or answers nonsense, the call is
counted (``index_errors``, logged at most once a minute) and the pool goes on as if the
index were not there (blocks are written, the master's eviction guards the pool); for
:data:`INDEX_BACKOFF_S` after a failure the index is not asked at all, so a Redis that is
down costs the engine thread one failed call per backoff, not one per step.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import redis

from kvpool.budget import PoolBudget
from kvpool.chain_index import NO_BUDGET, ChainIndex, IndexReplyError, Link
from kvpool.keys import KeySpace
from kvpool.store import MooncakeStore

log = logging.getLogger(__name__)

LOG_EVERY_S = 60.0
INDEX_BACKOFF_S = 5.0


@dataclass
class EvictionStats:
    """What this process's eviction did (counters since start)."""

    evicted_blocks: int = 0
    """Blocks this process evicted for the budget (their objects removed)."""
    refused_blocks: int = 0
    """Blocks not written because they, or a block they extend, were being evicted."""
    orphans_removed: int = 0
    """Blocks written while another writer evicted them, removed after the write."""
    index_errors: int = 0
    """Index calls that failed (Redis unreachable or a malformed answer)."""


class ChainEvictor:
    """Chain-aware eviction for one pool member (see the module docstring).

    ``block_bytes`` is what one block takes in the pool (all its objects).
    """

    def __init__(
        self,
        index: ChainIndex,
        store: MooncakeStore,
        keys: KeySpace,
        block_bytes: int,
        budget: Callable[[], int | None],
    ) -> None:
        self.index = index
        self.store = store
        self.keys = keys
        self.block_bytes = block_bytes
        self.budget = budget
        self.stats = EvictionStats()
        self._logged_at = -LOG_EVERY_S
        self._down_until = 0.0

    @property
    def index_up(self) -> bool:
        """Whether to ask the index now (not within the backoff after a failure)."""
        return time.monotonic() >= self._down_until

    @contextmanager
    def _guarded(self, what: str) -> Iterator[None]:
        """Count and (rarely) log a failed index call instead of raising it."""
        try:
            yield
        except (redis.RedisError, OSError, IndexReplyError) as exc:
            self.stats.index_errors += 1
            self._down_until = time.monotonic() + INDEX_BACKOFF_S
            if time.monotonic() - self._logged_at >= LOG_EVERY_S:
                self._logged_at = time.monotonic()
                log.warning(
                    "the pool's chain index failed (%s): %s; going on without it", what, exc
                )

    def links(self, hashes: Sequence[int], parents: Sequence[int | None]) -> list[Link]:
        """The index links of blocks ``hashes`` extending ``parents`` (``None``: a chain's
        first block, or unknown)."""
        meta = self.keys.meta_key
        return [
            Link(meta(h), "" if p is None else meta(p), self.block_bytes)
            for h, p in zip(hashes, parents, strict=True)
        ]

    def admit(self, hashes: Sequence[int], parents: Sequence[int | None]) -> list[bool]:
        """Claim blocks about to be written (a run in chain order); evict what the budget
        asks for and remove it from the store. Returns, per block, whether to write it."""
        budget = self.budget()
        admitted = [True] * len(hashes)
        if not hashes or not self.index_up:
            return admitted
        with self._guarded("admit"):
            claimed = self.index.claim(
                self.links(hashes, parents), NO_BUDGET if budget is None else budget
            )
            admitted = claimed.admitted
            self._bury(claimed.victims)
        self.stats.refused_blocks += admitted.count(False)
        return admitted

    def _bury(self, victims: list[str]) -> None:
        """Remove evicted blocks' objects, then tell the index they are gone."""
        if victims:
            self.remove(victims)
            self.index.bury(victims)
            self.stats.evicted_blocks += len(victims)

    def settle(self, written: Sequence[str], failed: Sequence[str]) -> None:
        """After a commit of claimed blocks (meta keys): ``written`` landed, ``failed`` did
        not (in chain order)."""
        gone: list[str] = []
        if not self.index_up:
            return
        with self._guarded("settle"):
            gone = self.index.settle(written, failed[::-1])
        if gone:
            self.remove(gone)
            self.stats.orphans_removed += len(gone)

    def forget(self, meta_key: str) -> None:
        """A block was removed as bad: forget it (when no indexed block extends it)."""
        self.settle([], [meta_key])

    def touch(self, hashes: Sequence[int], parents: Sequence[int | None]) -> None:
        """Refresh blocks just read (a run in chain order): they become the most recent."""
        if hashes and self.index_up:
            with self._guarded("touch"):
                self.index.claim(self.links(hashes, parents))

    def remove(self, blocks: Sequence[str]) -> None:
        """Remove blocks' objects: every meta first, then every layer."""
        self.store.remove(list(blocks))
        self.store.remove([k for block in blocks for k in self.keys.layer_keys(block)])

    def close(self) -> None:
        if isinstance(self.budget, PoolBudget):
            self.budget.close()


def chain_parents(hashes: Sequence[int], first_parent: int | None) -> list[int | None]:
    """The parents of a run of consecutive blocks ``hashes`` whose first one extends
    ``first_parent``."""
    return [first_parent, *hashes[:-1]][: len(hashes)]

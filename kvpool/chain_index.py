"""Which pool blocks extend which, and when each was last used: the shared index that
chain-aware eviction (:mod:`kvpool.evictor`) decides by, kept in the cluster's Redis.

Every writer and reader of the pool updates it, and every writer evicts through it, so
several workers evicting at once agree. Each operation is one Lua script, atomic in Redis
(:mod:`kvpool.chain_scripts`):

- :meth:`ChainIndex.claim`: before writing a run of blocks (or after reading them), index
  each block under its parent with a fresh tick of a logical clock (the blocks of a run get
  increasing ticks, so a chain's tail is its newest block), then, while the indexed bytes
  exceed the budget, evict the least recently used *leaf* (a block no indexed block
  extends): a block is never evicted while a block that extends it stays. An evicted block
  is *doomed* until its objects are removed (:meth:`ChainIndex.bury`) or ``doom_ttl_s``
  passes: meanwhile no writer may write it or a block that extends it (refused in the
  answer), so a writer racing the eviction cannot leave a block whose parent is gone; after
  the burial, until the doom would have ended, the block may be written again but a block
  that extends it only once it is (a writer that read it before the eviction would
  otherwise index a block whose parent is gone). Blocks of the same call are never evicted
  by it;
- :meth:`ChainIndex.settle`: after the write, forget the blocks that did not land (when no
  block extends them) and name the written blocks that another writer evicted meanwhile,
  whose objects the caller removes (nothing indexes them any more).

Members are the blocks' meta keys (:mod:`kvpool.keys`), so one index serves every
namespace of a pool. A block whose parent is not indexed still counts as its parent's
child, so that parent, when it is indexed later, is not a leaf. What Redis says is checked
before use (:class:`IndexReplyError`); anyone who can write these keys can make the pool
evict early or late, never make a reader load an unverified block (the pool's MACs and
digests guard that).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import redis

from kvpool.chain_scripts import BURY, CLAIM, KEY_NAMES, SETTLE

DOOM_TTL_S = 30.0
"""How long an evicted block stays unwritable if its evictor never says its objects are
gone (it died between the eviction and the removal)."""
NO_BUDGET = -1


class IndexReplyError(RuntimeError):
    """Redis answered a script with something that is not what the script returns."""


class Link(NamedTuple):
    """One block of a run: its ``block`` (meta key), the block it extends (``""`` for a
    chain's first block, or when unknown) and its ``size`` in the pool (bytes)."""

    block: str
    parent: str
    size: int


class Claimed(NamedTuple):
    """What :meth:`ChainIndex.claim` did: per block of the run, whether it may be written
    (``False``: it or its parent is being evicted), and the blocks it evicted."""

    admitted: list[bool]
    victims: list[str]


@dataclass(frozen=True)
class IndexStats:
    """The index now: blocks, leaves, bytes, evictions in progress, counters since it began."""

    blocks: int
    leaves: int
    used_bytes: int
    doomed: int
    evicted: int
    refused: int
    forgotten: int


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, str):
        return value
    raise IndexReplyError(f"expected a string from Redis, got {type(value).__name__}")


def _texts(value: Any) -> list[str]:
    if not isinstance(value, list):
        raise IndexReplyError(f"expected a list from Redis, got {type(value).__name__}")
    return [_text(v) for v in value]


class ChainIndex:
    """The shared chain index under ``prefix`` in Redis (see the module docstring).

    ``client`` is a ``redis.Redis`` (thread-safe; this object holds no other state).
    Lifecycle: none; the index lives in Redis, empty until the first claim, and
    :meth:`clear` empties it (tests, benchmarks).
    """

    def __init__(self, client: redis.Redis, prefix: str, doom_ttl_s: float = DOOM_TTL_S) -> None:
        if doom_ttl_s <= 0:
            raise ValueError("doom_ttl_s must be positive")
        self.client = client
        self.keys = [f"{{{prefix}}}:{name}" for name in KEY_NAMES]
        self.doom_ttl_s = doom_ttl_s
        self._claim = client.register_script(CLAIM)
        self._bury = client.register_script(BURY)
        self._settle = client.register_script(SETTLE)

    def claim(self, links: Sequence[Link], budget: int = NO_BUDGET) -> Claimed:
        """Index or refresh ``links`` (a run in chain order), then evict leaves until the
        indexed bytes are at most ``budget`` (:data:`NO_BUDGET`: no eviction). The caller
        must remove every victim's objects, then :meth:`bury` them."""
        if not links:
            return Claimed([], [])
        args: list[str | int | float] = [budget, self.doom_ttl_s, len(links)]
        for link in links:
            if link.size < 0:
                raise ValueError(f"block size must be >= 0, got {link.size}")
            args += [link.block, link.parent, link.size]
        reply = self._claim(keys=self.keys, args=args)
        if not isinstance(reply, list) or len(reply) != 2:
            raise IndexReplyError(f"claim answered {reply!r}")
        flags = _text(reply[0])
        if len(flags) != len(links) or set(flags) - {"0", "1"}:
            raise IndexReplyError(f"claim answered flags {flags!r} for {len(links)} blocks")
        return Claimed([f == "1" for f in flags], _texts(reply[1]))

    def bury(self, victims: Sequence[str]) -> None:
        """Say the objects of evicted ``victims`` are gone (writers may write them again)."""
        if victims:
            doomed, gone = (self.keys[KEY_NAMES.index(name)] for name in ("doomed", "gone"))
            self._bury(keys=[doomed, gone], args=list(victims))

    def settle(self, written: Sequence[str], failed: Sequence[str]) -> list[str]:
        """After a write: forget each of ``failed`` (give them tail first) that no indexed
        block extends; returns the blocks of ``written`` no longer indexed (evicted while
        they were written), whose objects the caller removes."""
        if not written and not failed:
            return []
        args: list[str | int] = [len(failed), *failed, *written]
        return _texts(self._settle(keys=self.keys, args=args))

    def parent_of(self, block: str) -> str | None:
        """The indexed parent of ``block`` (``""`` for a first block), ``None`` if not indexed."""
        raw = self.client.hget(self.keys[KEY_NAMES.index("parent")], block)
        return None if raw is None else _text(raw)

    def blocks(self) -> list[str]:
        """Every indexed block, least recently used first."""
        return _texts(self.client.zrange(self.keys[0], 0, -1))

    def stats(self) -> IndexStats:
        pipe = self.client.pipeline(transaction=False)
        recency, leaves, _, _, _, used, _, doomed, counts, _ = self.keys
        pipe.zcard(recency)
        pipe.zcard(leaves)
        pipe.get(used)
        pipe.zcard(doomed)
        pipe.hgetall(counts)
        n_blocks, n_leaves, used_raw, n_doomed, raw_counts = pipe.execute()
        tally = {_text(k): int(v) for k, v in dict(raw_counts).items()}
        return IndexStats(
            blocks=int(n_blocks),
            leaves=int(n_leaves),
            used_bytes=int(used_raw or 0),
            doomed=int(n_doomed),
            evicted=tally.get("evicted", 0),
            refused=tally.get("refused", 0),
            forgotten=tally.get("forgotten", 0),
        )

    def clear(self) -> None:
        """Empty the index."""
        self.client.delete(*self.keys)

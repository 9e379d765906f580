"""vLLM's prefix cache under our block names: vLLM's KV events (``BlockStored``,
``BlockRemoved``, ``AllBlocksCleared``, each naming blocks by vLLM's own hash) turned into
ours (:class:`proto.kv_events.Stored` / ``Removed``, named by our keyed chain), so the
router's per-worker index (:mod:`router.placement.prefix_index`) sees a vLLM worker's cache as it
sees ours. Pure: the events come from :mod:`vllm_backend.event_feed`.

A ``BlockStored`` carries the blocks' token ids, the parent's vLLM hash and, per block,
vLLM's extra hash keys (the cache salt on a chain's first block): a block's name is our
chain's next link after its parent's name (the root of the salt for a first block), the
same name our engine and the connector give that prefix. A block whose parent this table
does not know (an event lost before it), or whose hash also covers what our names do not
(a LoRA adapter, multimodal inputs), is not named: the index then just does not know the
worker holds it (the index is a hint; its cost is a worse placement).

:class:`CacheNames` is an event source for :class:`workers.serve.kv_publisher.EventPublisher`
(``log_events``, ``take_events``, ``cached_names``), fed on the worker's event loop.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from kvpool.hashing import PrefixHasher
from proto.kv_events import KVEvent, Removed, Stored


class CacheNames:
    """The names of what vLLM's prefix cache holds (module docstring)."""

    def __init__(self, hasher: PrefixHasher, block_tokens: int) -> None:
        self.hasher = hasher
        self.bt = block_tokens
        self._names: dict[Any, int] = {}
        """vLLM block hash -> our name."""
        self._held: Counter[int] = Counter()
        """Our name -> how many of vLLM's blocks hold it."""
        self._events: list[KVEvent] = []
        self.unnamed = 0
        """Blocks stored that could not be named (module docstring)."""

    def stored(
        self,
        hashes: Sequence[Any],
        parent: Any | None,
        token_ids: Sequence[int],
        extra_keys: Sequence[Sequence[Any] | None] | None = None,
    ) -> None:
        """vLLM cached the blocks ``hashes`` (``token_ids``: theirs, in order) after the
        block ``parent`` (``None``: they start a chain)."""
        if parent is None:
            first = (extra_keys or [None])[0]
            salt = _salt(first)
            link = None if salt is None else self.hasher.root(salt)
        else:
            link = self._names.get(parent)
        keys = list(extra_keys or []) + [None] * len(hashes)
        for i, vllm_hash in enumerate(hashes):
            block = token_ids[i * self.bt : (i + 1) * self.bt]
            extra = keys[i] and not (i == 0 and parent is None)  # the salt is named above
            if link is None or len(block) != self.bt or extra:
                self.unnamed += len(hashes) - i
                return
            name = self.hasher.block(link, block)
            if vllm_hash not in self._names:
                self._names[vllm_hash] = name
                self._held[name] += 1
                if self._held[name] == 1:
                    self._events.append(Stored(name, link))
            link = name

    def removed(self, hashes: Sequence[Any]) -> None:
        """vLLM evicted the blocks ``hashes``."""
        for vllm_hash in hashes:
            name = self._names.pop(vllm_hash, None)
            if name is None:
                continue
            self._held[name] -= 1
            if self._held[name] <= 0:
                del self._held[name]
                self._events.append(Removed(name))

    def cleared(self) -> None:
        """vLLM emptied its prefix cache."""
        self._events += [Removed(name) for name in self._held]
        self._names.clear()
        self._held.clear()

    def holds(self, names: Sequence[int]) -> int:
        """How many leading ``names`` the cache holds."""
        return next((i for i, n in enumerate(names) if n not in self._held), len(names))

    # -- as an event source (workers.serve.kv_publisher) -----------------------------------------
    def log_events(self) -> None:
        """Events are always logged here."""

    def take_events(self) -> list[KVEvent]:
        events, self._events = self._events, []
        return events

    def cached_names(self) -> list[int]:
        return list(self._held)


def _salt(keys: Sequence[Any] | None) -> str | None:
    """The cache salt among a chain's first block's extra keys ("" when there are none),
    or None when they hold more than a salt (multimodal, LoRA: not nameable here)."""
    if not keys:
        return ""
    if len(keys) == 1 and isinstance(keys[0], str):
        return keys[0]
    return None

"""The connector's per-request bookkeeping, free of vLLM: which prompt tokens the pool can
give a request, what a step loads and what it writes (pure logic over token ids and block
ids; :mod:`vllm_backend.conn_scheduler` feeds it vLLM's objects).

Block names are our engine's (:class:`kvpool.hashing.PrefixHasher`): the chain of a
request's full blocks, rooted at its cache salt, so vLLM workers and ours name a prefix
alike. The rules, as on our engine:

- a lookup never offers the block that holds a request's last token (vLLM computes at
  least one token), and offers only blocks past the ones the engine holds already;
- a request continued after a remote prefill (``adopt``: its tokens are the prompt and the
  first token) may also take the prompt's partial last block, which the prefill worker left
  under the request's id, once every full block before it is there;
- each step writes the full blocks it completes whose token ids are known (a block whose
  last token is still being sampled waits one step), past what the request held, loaded or
  planned already; a prompt handed off (``handoff``) whose prefill ends in the step writes
  every full block of its prompt and its partial last block.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from kvpool.hashing import PrefixHasher
from kvpool.stream import WriteIntent

RID = "rid"
"""``kv_transfer_params`` key: the router's request id (pool key of a partial block)."""
HANDOFF = "handoff"
"""``kv_transfer_params`` key: the prompt is handed off to a decode worker after it."""
ADOPT = "adopt"
"""``kv_transfer_params`` key: the request continues a prompt prefilled elsewhere."""


class LoadItem(NamedTuple):
    """One request's load in a step: ``names`` (full blocks) into ``pages``, then, with
    ``partial`` tokens (> 0), its partial last block (request key of ``rid``) into
    ``pages[-1]``; ``prefix`` is the chain the engine held before them."""

    req_id: str
    rid: str
    names: list[int]
    pages: list[int]
    prefix: list[int]
    partial: int

    def tokens(self, good: int, block_tokens: int) -> int:
        """The tokens that arrived when the leading ``good`` of its pages did."""
        full = min(good, len(self.names)) * block_tokens
        return full + (self.partial if self.partial and good == len(self.pages) else 0)


@dataclass
class Tracked:
    """What the connector keeps of one request between its admission and its end."""

    rid: str
    salt: str
    handoff: bool
    adopt: bool
    prompt_len: int
    """The prompt the pool knows (an adopted request's: without its first token)."""
    names: list[int] = field(default_factory=list)
    """Its chain so far (full blocks whose token ids were known)."""
    match: tuple[int, int, int] = (0, 0, 0)
    """The last lookup: (blocks held, pool blocks after them, partial tokens)."""
    written: int | None = None
    """Blocks written, loaded or held so far (None: not since its last admission)."""


class Planner:
    """Names blocks and plans a request's loads and writes (module docstring)."""

    def __init__(self, hasher: PrefixHasher, block_tokens: int) -> None:
        self.hasher = hasher
        self.bt = block_tokens

    def chain(self, tracked: Tracked, tokens: Sequence[int], blocks: int) -> list[int]:
        """The first ``blocks`` names of ``tracked``'s chain over ``tokens`` (extended as
        needed and kept)."""
        have = len(tracked.names)
        if blocks > have:
            parent = tracked.names[-1] if have else self.hasher.root(tracked.salt)
            part = tokens[have * self.bt : blocks * self.bt]
            tracked.names += self.hasher.chain(part, self.bt, parent)
        return tracked.names[:blocks]

    def match(
        self,
        tracked: Tracked,
        tokens: Sequence[int],
        held_tokens: int,
        present: Callable[[list[int]], int],
        partial_present: Callable[[str], bool],
    ) -> int:
        """How many tokens past ``held_tokens`` (block-aligned: the engine's own hits) the
        pool can give; ``present(names)`` counts the leading names it holds,
        ``partial_present(rid)`` says whether ``rid``'s partial block is there."""
        held = held_tokens // self.bt
        usable = (len(tokens) - 1) // self.bt
        found = 0
        if usable > held:
            found = present(self.chain(tracked, tokens, usable)[held:])
        tail = tracked.prompt_len % self.bt
        partial = 0
        adopting = tracked.adopt and len(tokens) == tracked.prompt_len + 1
        if adopting and tail and held + found == tracked.prompt_len // self.bt:
            partial = tail if partial_present(tracked.rid) else 0
        tracked.match = (held, found, partial)
        return found * self.bt + partial

    def load(
        self, req_id: str, tracked: Tracked, block_ids: Sequence[int], external: int
    ) -> LoadItem | None:
        """The load of ``external`` tokens vLLM accepted of the last :meth:`match` (pages
        from the request's ``block_ids``), or None."""
        held, found, partial = tracked.match
        if external <= 0:
            return None
        full = min(found, external // self.bt)
        with_partial = bool(partial) and external == found * self.bt + partial
        names = tracked.names[held : held + full]
        pages = list(block_ids[held : held + full + with_partial])
        if not names and not with_partial:
            return None
        tail = partial if with_partial else 0
        return LoadItem(req_id, tracked.rid, names, pages, tracked.names[:held], tail)

    def write(
        self,
        tracked: Tracked,
        tokens: Sequence[int],
        computed: int,
        scheduled: int,
        block_ids: Sequence[int],
    ) -> WriteIntent | None:
        """What a step that computes ``scheduled`` tokens after ``computed`` may write for
        ``tracked`` (``tokens``: its token ids known so far; ``block_ids``: its pages)."""
        end = computed + scheduled
        if tracked.written is None:  # (re)admitted: what it holds or loaded is there
            tracked.written = computed // self.bt
        if tracked.handoff and end == tracked.prompt_len:
            full = tracked.prompt_len // self.bt
            names = self.chain(tracked, tokens, full)
            tail = tracked.prompt_len % self.bt
            partial = (block_ids[full], tail) if tail else None
            tracked.written = max(tracked.written, full)
            blocks = list(zip(names, block_ids, strict=False))
            return WriteIntent(tracked.rid, blocks, None, partial)
        start, stop = tracked.written, min(end, len(tokens)) // self.bt
        if stop <= start:
            return None
        names = self.chain(tracked, tokens, stop)
        tracked.written = stop
        blocks = list(zip(names[start:stop], block_ids[start:stop], strict=True))
        return WriteIntent(tracked.rid, blocks, names[start - 1] if start else None)

"""Continuous batching with chunked prefill and preemption by recompute.

Pure bookkeeping (no torch). Requests live in two queues:

1. ``waiting``: new requests, and preempted ones put back at the front;
2. ``running``: requests that hold pages.

Each :meth:`Scheduler.schedule` call builds one step under a token budget
(``max_num_batched_tokens``) and a sequence cap (``max_num_seqs``):

1. running requests in decode (one token left to compute) go first, so a long prompt never
   stalls the tokens of others;
2. then running requests still in prefill get the next chunk of their prompt;
3. then waiting requests are admitted in arrival order, each taking its prefix-cache hits
   (first pulling further prefix blocks from the shared pool, when one is attached, into
   the local cache) and a first chunk, while budget and pages last.

When pages run out for a running request, the most recently admitted running request is
preempted: its pages are freed and it goes back to the front of ``waiting``, to be
recomputed later (its prompt and the tokens produced so far). After the model ran,
:meth:`Scheduler.update` advances each request's computed tokens and names its new full blocks.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

from kvpool.hashing import PrefixHasher
from workers.config import EngineConfig
from workers.core.block_manager import BlockManager, RemotePrefix
from workers.core.sequence import FinishReason, SeqStatus, Sequence


@dataclass(frozen=True)
class SchedulerConfig:
    """Budgets of one engine; see :class:`workers.config.EngineConfig` for their meaning
    and defaults. ``max_model_len`` is the resolved one (the engine's config may say 0:
    the model's own)."""

    num_blocks: int
    block_tokens: int
    max_model_len: int
    max_num_seqs: int = EngineConfig.max_num_seqs
    max_num_batched_tokens: int = EngineConfig.max_num_batched_tokens
    prefix_caching: bool = EngineConfig.prefix_caching

    def __post_init__(self) -> None:
        for name in ("num_blocks", "block_tokens", "max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


class BatchEntry(NamedTuple):
    """One sequence of a step and how many of its tokens the step computes (from its
    ``num_computed_tokens`` on)."""

    seq: Sequence
    num_tokens: int

    @property
    def is_decode(self) -> bool:
        """Whether it computes its sequence's one last uncomputed token (a decode, as the
        model runner decides; anything else is a prefill chunk)."""
        return self.num_tokens == 1 and self.seq.num_uncomputed == 1


@dataclass
class ScheduledBatch:
    """One step: a :class:`BatchEntry` per sequence, decodes first."""

    entries: list[BatchEntry] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    committed: list[tuple[int, int]] = field(default_factory=list)
    """``(hash, page)`` of blocks that became full and named in this step (set by update)."""

    @property
    def num_tokens(self) -> int:
        return sum(entry.num_tokens for entry in self.entries)

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens this batch computes (0: a decode-only step)."""
        return sum(
            min(n, max(0, seq.num_prompt_tokens - seq.num_computed_tokens))
            for seq, n in self.entries
        )

    def shape(self) -> tuple[tuple[tuple[int, int], ...], tuple[int, ...]]:
        """``(prefill, decode)`` before the step runs: ``(new tokens, tokens already
        computed)`` per prefilling sequence, and the context of each decode (an entry of one
        token that is its sequence's last uncomputed one, as the model runner decides)."""
        prefill: list[tuple[int, int]] = []
        decode: list[int] = []
        for entry in self.entries:
            if entry.is_decode:
                decode.append(entry.seq.num_computed_tokens)
            else:
                prefill.append((entry.num_tokens, entry.seq.num_computed_tokens))
        return tuple(prefill), tuple(decode)

    def __bool__(self) -> bool:
        return bool(self.entries)


class Scheduler:
    def __init__(
        self, config: SchedulerConfig, hasher: PrefixHasher, remote: RemotePrefix | None = None
    ) -> None:
        self.config = config
        self.remote = remote
        self.blocks = BlockManager(
            config.num_blocks, config.block_tokens, hasher, config.prefix_caching
        )
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    # -- queue verbs -------------------------------------------------------------------
    def check_fits(self, seq: Sequence) -> None:
        """Raise ``ValueError`` if ``seq`` could never run, however idle the engine."""
        total = seq.num_prompt_tokens + seq.params.max_tokens
        if total > self.config.max_model_len:
            raise ValueError(
                f"prompt ({seq.num_prompt_tokens} tokens) plus max_tokens "
                f"({seq.params.max_tokens}) "
                f"exceeds the model length ({self.config.max_model_len})"
            )
        # The last sampled token ends the request before its KV is ever computed.
        pages = self.blocks.blocks_for(total - 1)
        if pages > self.config.num_blocks:
            raise ValueError(
                f"request needs {pages} KV pages but the cache has "
                f"{self.config.num_blocks}; raise the KV cache size"
            )

    def add(self, seq: Sequence) -> None:
        self.check_fits(seq)
        seq.status = SeqStatus.WAITING
        self.waiting.append(seq)

    def reserve(self, seq: Sequence) -> bool:
        """Hold pages for all of ``seq``'s prompt, taking its local prefix hits, without
        queueing it (a decode worker's reservation: the prompt's KV comes from elsewhere).
        False if the pages are not free now; ``ValueError`` if it could never fit."""
        self.check_fits(seq)
        hits = self.blocks.match_prefix(seq)
        n = seq.num_prompt_tokens - len(hits.pages) * self.config.block_tokens
        if not self.blocks.can_allocate(seq, n, hits.pages):
            return False
        self.blocks.allocate(seq, n, hits)
        seq.status = SeqStatus.RESERVED
        return True

    def resume(self, seq: Sequence) -> None:
        """Run ``seq``, which already holds pages (a decode worker's reservation whose prompt
        KV arrived): it joins ``running`` whatever the sequence cap, as its pages are held."""
        seq.status = SeqStatus.RUNNING
        self.running.append(seq)

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        """End ``seq`` (any state) and give back its pages. Idempotent."""
        if seq.is_finished:
            return
        if seq.status is SeqStatus.RUNNING:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.blocks.deallocate(seq)
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = reason

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def queued_prefill_tokens(self) -> int:
        """Prompt tokens still to compute, over waiting and running requests."""
        seqs = [*self.waiting, *self.running]
        return sum(max(0, s.num_prompt_tokens - s.num_computed_tokens) for s in seqs)

    # -- one step ------------------------------------------------------------------------
    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.config.max_num_batched_tokens
        decodes = [s for s in self.running if s.num_uncomputed == 1]
        prefills = [s for s in self.running if s.num_uncomputed > 1]
        for seq in decodes + prefills:
            if budget == 0:
                break
            if seq.status is not SeqStatus.RUNNING:  # preempted earlier in this loop
                continue
            n = min(seq.num_uncomputed, budget)
            if not self._make_room(seq, n, batch):
                continue
            self.blocks.allocate(seq, n)
            batch.entries.append(BatchEntry(seq, n))
            budget -= n
        if not batch.preempted:
            budget = self._admit(batch, budget)
        batch.entries.sort(key=lambda entry: not entry.is_decode)
        return batch

    def _make_room(self, seq: Sequence, n: int, batch: ScheduledBatch) -> bool:
        """Preempt the newest running requests until ``seq`` fits; False if ``seq`` went."""
        while not self.blocks.can_allocate(seq, n):
            victim = self.running[-1]
            self._preempt(victim, batch)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence, batch: ScheduledBatch) -> None:
        self.running.remove(seq)
        self.blocks.deallocate(seq)
        seq.num_cached_tokens = 0
        seq.status = SeqStatus.WAITING
        self.waiting.appendleft(seq)
        batch.entries = [entry for entry in batch.entries if entry.seq is not seq]
        batch.preempted.append(seq)
        self.num_preemptions += 1

    def _admit(self, batch: ScheduledBatch, budget: int) -> int:
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            if self.remote is not None and not seq.num_pool_tokens:
                pulled = self.blocks.pull_remote(seq, self.remote)
                seq.num_pool_tokens = pulled * self.config.block_tokens
            hits = self.blocks.match_prefix(seq)
            n = min(seq.num_uncomputed - len(hits.pages) * self.config.block_tokens, budget)
            if not self.blocks.can_allocate(seq, n, hits.pages):
                break
            self.waiting.popleft()
            self.blocks.allocate(seq, n, hits)
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            batch.entries.append(BatchEntry(seq, n))
            budget -= n
        return budget

    def update(self, batch: ScheduledBatch) -> None:
        """After the model ran ``batch``: advance progress and index newly full blocks."""
        for seq, n in batch.entries:
            seq.num_computed_tokens += n
            batch.committed.extend(self.blocks.commit(seq))

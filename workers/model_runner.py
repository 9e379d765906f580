"""Runs one scheduled step on the model: batch tensors in, sampled tokens out.

1. :meth:`ModelRunner.prepare` flattens the step (decode tokens first, then each prefill
   chunk) into ids, positions and an :class:`AttentionBatch`, and picks the rows whose
   sequence reaches its last known token this step (those get logits and a sample);
2. :meth:`ModelRunner.execute` runs the model and samples one token for each such row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from workers.kv_cache import KVCache
from workers.model.attention import AttentionBatch, PrefillSpan
from workers.model.llama import LlamaModel
from workers.model.rope import RotaryTable
from workers.sampling import make_generator, sample
from workers.scheduler import ScheduledBatch
from workers.sequence import Sequence


@dataclass
class PreparedStep:
    input_ids: torch.Tensor
    positions: torch.Tensor
    attention: AttentionBatch
    logits_rows: torch.Tensor
    sampled: list[Sequence]


class ModelRunner:
    """Owns the model, its KV cache, the rotary table and per-request RNGs."""

    def __init__(self, model: LlamaModel, kv: KVCache, rope: RotaryTable) -> None:
        self.model = model
        self.kv = kv
        self.rope = rope
        self.device = kv.slab.device
        self._generators: dict[str, torch.Generator | None] = {}
        self.last_logits: torch.Tensor | None = None
        """fp32 logits of the latest step's sampled rows, in ``sampled`` order (inspection)."""

    def forget(self, request_id: str) -> None:
        """Drop a finished request's RNG."""
        self._generators.pop(request_id, None)

    def skip_draws(self, seq: Sequence, count: int) -> None:
        """Advance a seeded request's RNG past ``count`` draws made elsewhere (the first token
        sampled by a prefill worker), so it goes on as if it had run here all along."""
        generator = self._generator(seq)
        if generator is None:
            return
        uniform = torch.ones(self.model.cfg.vocab_size, device=self.device)
        for _ in range(count):  # a draw advances the state by the same amount for any probs
            torch.multinomial(uniform, 1, generator=generator)

    def _generator(self, seq: Sequence) -> torch.Generator | None:
        if seq.request_id not in self._generators:
            self._generators[seq.request_id] = make_generator(seq.params.seed, self.device)
        return self._generators[seq.request_id]

    def prepare(self, batch: ScheduledBatch) -> PreparedStep:
        bt = self.kv.block_tokens
        ids: list[int] = []
        pos: list[int] = []
        rows: list[int] = []
        sampled: list[Sequence] = []
        tables: list[list[int]] = []
        ctx: list[int] = []
        spans: list[PrefillSpan] = []
        for seq, n in batch.entries:
            start = seq.num_computed_tokens
            if n == 1 and seq.num_uncomputed == 1 and not spans:
                tables.append(seq.block_table)
                ctx.append(start + 1)
            else:
                spans.append(self._span(seq, len(ids), n))
            ids.extend(seq.token_ids[start : start + n])
            pos.extend(range(start, start + n))
            if start + n == seq.num_tokens:
                rows.append(len(ids) - 1)
                sampled.append(seq)
        positions = torch.tensor(pos, dtype=torch.long)
        block_ids = self._slot_pages(batch, positions)
        decode_tables = decode_mask = None
        if tables:
            width = max(len(t) for t in tables)
            decode_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables])
            lens = torch.tensor(ctx).unsqueeze(1)
            decode_mask = (torch.arange(width * bt).unsqueeze(0) < lens)[:, None, None, :]
        to = self.device
        attention = AttentionBatch(
            slot_blocks=block_ids.to(to),
            slot_offsets=(positions % bt).to(to),
            num_decode=len(tables),
            decode_block_tables=None if decode_tables is None else decode_tables.to(to),
            decode_mask=None if decode_mask is None else decode_mask.to(to),
            prefills=spans,
        )
        return PreparedStep(
            torch.tensor(ids, dtype=torch.long, device=to),
            positions.to(to),
            attention,
            torch.tensor(rows, dtype=torch.long, device=to),
            sampled,
        )

    def _slot_pages(self, batch: ScheduledBatch, positions: torch.Tensor) -> torch.Tensor:
        """The page of every token of the step, gathered from the concatenated block tables."""
        flat = torch.tensor([b for seq, _ in batch.entries for b in seq.block_table])
        starts = torch.tensor([len(seq.block_table) for seq, _ in batch.entries]).cumsum(0)
        starts = torch.cat((torch.zeros(1, dtype=torch.long), starts[:-1]))
        counts = torch.tensor([n for _, n in batch.entries])
        return flat[starts.repeat_interleave(counts) + positions // self.kv.block_tokens]

    def _span(self, seq: Sequence, start: int, n: int) -> PrefillSpan:
        cached = seq.num_computed_tokens
        span = PrefillSpan(start=start, length=n, context_len=cached + n)
        if cached:
            nb = -(-(cached + n) // self.kv.block_tokens)
            span.block_table = torch.tensor(seq.block_table[:nb], device=self.device)
            q_pos = torch.arange(cached, cached + n, device=self.device).unsqueeze(1)
            span.mask = torch.arange(cached + n, device=self.device).unsqueeze(0) <= q_pos
        return span

    @torch.inference_mode()
    def execute(
        self, batch: ScheduledBatch, on_layer: Callable[[int], None] | None = None
    ) -> tuple[list[Sequence], list[int]]:
        """Run ``batch``; returns the sequences that got a new token, and the tokens.

        ``on_layer(i)`` is called as soon as layer ``i``'s KV is in the cache."""
        step = self.prepare(batch)
        hidden = self.model(
            step.input_ids, step.positions, self.rope, self.kv.layers, step.attention, on_layer
        )
        if not step.sampled:
            return [], []
        logits = self.model.logits(hidden[step.logits_rows])
        self.last_logits = logits
        tokens = sample(
            logits, [s.params for s in step.sampled], [self._generator(s) for s in step.sampled]
        )
        return step.sampled, tokens

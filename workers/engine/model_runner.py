"""Runs one scheduled step on the model: batch tensors in, sampled tokens out.

1. :meth:`ModelRunner.prepare` flattens the step (decode tokens first, then each prefill
   chunk) into ids, positions and an :class:`AttentionBatch`, and picks the rows whose
   sequence reaches its last known token this step (those get logits and a sample);
2. :meth:`ModelRunner.execute` runs the model and samples one token for each such row,
   after the rows' logits processors (:mod:`workers.core.logits_processors`: ``logit_bias``,
   ``min_tokens``, penalties; the EOS ids the runner was given are what ``min_tokens``
   holds back). A row whose processing or sampling fails fails alone: the batch is
   processed and sampled again row by row from the same logits (seeded generators rewound
   first), so its neighbours get exactly the tokens they would have got. Requests that
   asked get the raw logprobs of their sampled tokens, and of the prompt tokens each
   prefill chunk predicted (:mod:`workers.core.logprobs`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

import torch

from workers.core.block_tables import BlockTables
from workers.core.kv_cache import KVCache
from workers.core.logits_processors import process
from workers.core.logprobs import PromptRows, plan_prompt_rows, prompt_logprobs, sampled_logprobs
from workers.core.sampling import make_generator, sample
from workers.core.scheduler import BatchEntry, ScheduledBatch
from workers.core.sequence import Sequence, TokenLogprob
from workers.model.attention import AttentionBatch, DecodeKernel, decode_kernel_for
from workers.model.llama import LlamaModel
from workers.model.rope import RotaryTable

log = logging.getLogger(__name__)


def describe(exc: BaseException) -> str:
    """What a client is told about an engine failure on its request (one line, bounded)."""
    text = f"{type(exc).__name__}: {exc}".splitlines()[0] if str(exc) else type(exc).__name__
    return text[:200]


@dataclass
class Sampled:
    """One step's samples: ``tokens[i]`` is ``seqs[i]``'s new token (``logprobs[i]`` its
    logprob, None unless asked for); ``failed`` holds the sequences whose sampling failed,
    with the reason (they got no token); ``prompt_logprobs``: the prompt logprobs each
    sequence that wants them got this step, in prompt order."""

    seqs: list[Sequence] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    failed: list[tuple[Sequence, str]] = field(default_factory=list)
    logprobs: list[TokenLogprob | None] = field(default_factory=list)
    prompt_logprobs: list[tuple[Sequence, list[TokenLogprob]]] = field(default_factory=list)

    def merge(self, other: Sampled) -> None:
        """Append ``other``'s results (a sub-step of the same batch) to these."""
        self.seqs += other.seqs
        self.tokens += other.tokens
        self.failed += other.failed
        self.logprobs += other.logprobs
        self.prompt_logprobs += other.prompt_logprobs


@dataclass
class PreparedStep:
    input_ids: torch.Tensor
    positions: torch.Tensor
    attention: AttentionBatch
    logits_rows: torch.Tensor
    sampled: list[Sequence]
    prompt_rows: list[PromptRows] = field(default_factory=list)


class ModelRunner:
    """Owns the model, its KV cache, the rotary table and per-request RNGs."""

    def __init__(
        self,
        model: LlamaModel,
        kv: KVCache,
        rope: RotaryTable,
        native: bool = False,
        eos_token_ids: Collection[int] = frozenset(),
        decode_kernel: DecodeKernel | None = None,
    ) -> None:
        """``native``: attention through the C++ kernels (:mod:`workers.model.native`);
        ``eos_token_ids``: the model's EOS ids (``min_tokens`` bans them);
        ``decode_kernel``: how the torch path attends decodes (None: the device's choice,
        :func:`workers.model.attention.decode_kernel_for`). The device is the KV cache's:
        every step's tensors go there, and nothing assumes a CPU."""
        self.model = model
        self.eos_token_ids = eos_token_ids
        self.kv = kv
        self.rope = rope
        self.native = native
        self.device = kv.slab.device
        self.decode_kernel: DecodeKernel = decode_kernel or decode_kernel_for(self.device)
        self.tables = BlockTables(-(-rope.max_positions // kv.block_tokens))
        self._generators: dict[str, torch.Generator | None] = {}
        self.last_logits: torch.Tensor | None = None
        """fp32 logits of the latest step's sampled rows, in ``sampled`` order (inspection)."""

    def forget(self, request_id: str) -> None:
        """Drop a finished request's RNG and block-table row."""
        self._generators.pop(request_id, None)
        self.tables.release(request_id)

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
        """Flatten ``batch``: decodes first, then chunks over a cached prefix, then chunks
        that start a prompt (the order :class:`AttentionBatch` wants); per-token tensors
        (positions, slots) are computed vectorized from per-sequence ones."""
        decodes: list[BatchEntry] = []
        paged: list[BatchEntry] = []
        fresh: list[BatchEntry] = []
        for entry in batch.entries:
            if entry.is_decode:
                decodes.append(entry)
            else:
                (paged if entry.seq.num_computed_tokens else fresh).append(entry)
        order = decodes + paged + fresh
        ids: list[int] = []
        rows: list[int] = []
        sampled: list[Sequence] = []
        prompt_rows: list[PromptRows] = []
        table_rows: list[int] = []
        query_lens: list[int] = []
        context_lens: list[int] = []
        for seq, n in order:
            start = seq.num_computed_tokens
            if (plan := plan_prompt_rows(seq, start, n, len(ids))) is not None:
                prompt_rows.append(plan)
            ids.extend(seq.token_ids[start : start + n])
            table_rows.append(self.tables.row(seq))
            query_lens.append(n)
            context_lens.append(start + n)
            if start + n == seq.num_tokens:
                rows.append(len(ids) - 1)
                sampled.append(seq)
        bt = self.kv.block_tokens
        width = -(-max(context_lens) // bt)
        tables = self.tables.gather(table_rows, width)
        qlens = torch.tensor(query_lens, dtype=torch.int32)
        clens = torch.tensor(context_lens, dtype=torch.int32)
        starts = torch.zeros(len(order) + 1, dtype=torch.int32)
        torch.cumsum(qlens, 0, out=starts[1:])
        seq_of = torch.repeat_interleave(torch.arange(len(order)), qlens)
        # position of each token: its sequence's first new position + its index in the chunk
        positions = (clens - qlens)[seq_of] + torch.arange(len(ids)) - starts[:-1][seq_of]
        slots = tables[seq_of, positions // bt].long() * bt + positions % bt
        to = self.device
        attention = AttentionBatch(
            slot_mapping=slots.to(to),
            block_tables=tables.to(to),
            context_lens=clens.to(to),
            query_starts=starts.to(to),
            num_decode=len(decodes),
            # the native kernel attends a prompt's first chunk over the cache too (its K/V
            # are written first), about twice as fast as SDPA on CPUs (docs/benchmarks.md 7)
            num_paged=len(order) if self.native else len(decodes) + len(paged),
            query_lens=query_lens,
            context_lens_host=context_lens,
            block_tokens=bt,
            native=self.native,
            decode_kernel=self.decode_kernel,
        )
        return PreparedStep(
            torch.tensor(ids, dtype=torch.long).to(to),
            positions.to(to),
            attention,
            torch.tensor(rows, dtype=torch.long).to(to),
            sampled,
            prompt_rows,
        )

    @torch.inference_mode()
    def execute(
        self, batch: ScheduledBatch, on_layer: Callable[[int], None] | None = None
    ) -> Sampled:
        """Run ``batch``; returns the sequences that got a new token, and the tokens.

        ``on_layer(i)`` is called as soon as layer ``i``'s KV is in the cache. An exception
        from the model itself propagates (the caller isolates the request at fault)."""
        step = self.prepare(batch)
        hidden = self.model(
            step.input_ids, step.positions, self.rope, self.kv.layers, step.attention, on_layer
        )
        prompt = prompt_logprobs(hidden, step.prompt_rows, self.model.logits)
        if not step.sampled:
            return Sampled(prompt_logprobs=prompt)
        logits = self.model.logits(hidden[step.logits_rows])
        self.last_logits = logits
        result = self._sample(logits, step.sampled)
        result.logprobs = sampled_logprobs(logits, step.sampled, result.seqs, result.tokens)
        result.prompt_logprobs = prompt
        return result

    def _sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> Sampled:
        """Sample every row at once; if that fails, row by row (see the module docstring)."""
        generators = [self._generator(s) for s in seqs]
        states = [g.get_state() if g is not None else None for g in generators]
        try:
            return Sampled(seqs, self._draw(logits, seqs, generators))
        except Exception:
            log.exception("sampling a batch of %d failed; sampling row by row", len(seqs))
        result = Sampled()
        for i, seq in enumerate(seqs):
            g, state = generators[i], states[i]
            if g is not None and state is not None:
                g.set_state(state)
            try:
                token = self._draw(logits[i : i + 1], [seq], [g])[0]
            except Exception as exc:
                log.exception("sampling failed for %s; it fails alone", seq.request_id)
                result.failed.append((seq, describe(exc)))
                continue
            result.seqs.append(seq)
            result.tokens.append(token)
        return result

    def _draw(
        self,
        logits: torch.Tensor,
        seqs: list[Sequence],
        generators: list[torch.Generator | None],
    ) -> list[int]:
        """One token per row of ``logits``: the rows' processors, then the sampler (which
        leaves ``logits`` unchanged)."""
        processed = process(logits, seqs, self.eos_token_ids)
        return sample(processed, [s.params for s in seqs], generators)

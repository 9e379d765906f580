"""What a request's ``logit_bias``, ``min_tokens`` and penalties do to its logits.

:func:`process` runs before sampling (:func:`workers.core.sampling.sample`), in vLLM's order:

1. ``logit_bias``: each listed token's value is added to its logit;
2. ``min_tokens``: while the request has fewer output tokens than that, its stop tokens
   (``stop_token_ids``, and the model's EOS ids unless ``ignore_eos``) get ``-inf``, so
   they cannot be sampled (as transformers' ``MinNewTokensLengthLogitsProcessor``);
3. ``repetition_penalty`` ``p``: the logit of every token that occurs in the prompt or the
   output becomes ``logit / p`` if positive, ``logit * p`` otherwise (as transformers'
   ``RepetitionPenaltyLogitsProcessor``);
4. ``frequency_penalty`` ``f`` and ``presence_penalty`` ``r`` (OpenAI's formula):
   ``logit[t] -= f * count[t] + r * (count[t] > 0)``, ``count`` over output tokens only.

Each processor runs as tensor ops over only the rows that use it, so a batch computes each
row exactly as that row alone would (every op is row-wise). A batch in which no row uses
one gets its logits back untouched (not copied): the sampler's fast paths stay as they are.

A row's history is its sequence's ``token_ids`` (prompt, then output) split at
``num_prompt_tokens``: a request handed off from a prefill worker carries the same history
on its decode worker, so it is processed exactly as if it had run on one worker.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence
from typing import Protocol

import torch

from workers.core.sequence import SamplingParams


class History(Protocol):
    """A row's request: its params and its tokens so far (a :class:`workers.core.sequence.
    Sequence` is one)."""

    @property
    def params(self) -> SamplingParams: ...
    @property
    def token_ids(self) -> list[int]: ...
    @property
    def num_prompt_tokens(self) -> int: ...


def stop_tokens(row: History, eos_token_ids: Collection[int]) -> set[int]:
    """The tokens ``min_tokens`` bans from ``row`` now: its stop tokens while it has fewer
    than ``min_tokens`` outputs, else none."""
    p = row.params
    if len(row.token_ids) - row.num_prompt_tokens >= p.min_tokens:
        return set()
    return set(p.stop_token_ids) | (set() if p.ignore_eos else set(eos_token_ids))


def process(
    logits: torch.Tensor, rows: Sequence[History], eos_token_ids: Collection[int]
) -> torch.Tensor:
    """The logits ``[N, vocab]`` of ``rows`` after their processors (module docstring).

    ``logits`` itself is never changed (a batch that failed is sampled again from it): when
    a row uses a processor, they work on a copy, which is returned; with no such row,
    ``logits`` is returned as it is. A token id outside the vocabulary (in ``logit_bias``,
    say) raises, as any failure here; the caller contains it to the batch."""
    banned = [stop_tokens(r, eos_token_ids) for r in rows]
    if not any(r.params.logit_bias or r.params.penalized for r in rows) and not any(banned):
        return logits
    out = logits.clone()
    _scatter(out, [(i, r.params.logit_bias.items()) for i, r in enumerate(rows)], True)
    _scatter(out, [(i, ((t, -math.inf) for t in ban)) for i, ban in enumerate(banned)], False)
    _penalize_repetition(out, rows)
    _penalize_output(out, rows)
    return out


Entries = Iterable[tuple[int, float]]


def _scatter(out: torch.Tensor, rows: list[tuple[int, Entries]], accumulate: bool) -> None:
    """Put each row's (token, value) entries into ``out``: added (``accumulate``), or
    written over what is there."""
    row_of: list[int] = []
    tokens: list[int] = []
    values: list[float] = []
    for i, entries in rows:
        for token, value in entries:
            row_of.append(i)
            tokens.append(token)
            values.append(value)
    if not tokens:
        return
    dev = out.device
    index = (torch.tensor(row_of, device=dev), torch.tensor(tokens, device=dev))
    out.index_put_(index, torch.tensor(values, dtype=out.dtype, device=dev), accumulate)


def _token_counts(
    histories: list[list[int]], vocab: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """``[len(histories), vocab]``: how often each token occurs in each history (with
    ``dtype`` bool: whether it occurs)."""
    counts = torch.zeros(len(histories), vocab, dtype=dtype, device=device)
    lengths = torch.tensor([len(h) for h in histories], device=device)
    row_of = torch.repeat_interleave(torch.arange(len(histories), device=device), lengths)
    tokens = torch.tensor([t for h in histories for t in h], dtype=torch.long, device=device)
    ones = torch.ones(len(tokens), dtype=dtype, device=device)
    counts.index_put_((row_of, tokens), ones, accumulate=dtype != torch.bool)
    return counts


def _per_row(out: torch.Tensor, values: list[float]) -> torch.Tensor:
    """One value per chosen row, as a column that broadcasts over the vocabulary."""
    return torch.tensor(values, dtype=out.dtype, device=out.device).unsqueeze(1)


def _penalize_repetition(out: torch.Tensor, rows: Sequence[History]) -> None:
    """Step 3 on the rows with ``repetition_penalty != 1`` (prompt and output tokens)."""
    chosen = [i for i, r in enumerate(rows) if r.params.repetition_penalty != 1]
    if not chosen:
        return
    idx = torch.tensor(chosen, device=out.device)
    histories = [rows[i].token_ids for i in chosen]
    seen = _token_counts(histories, out.shape[-1], torch.bool, out.device)
    penalty = _per_row(out, [rows[i].params.repetition_penalty for i in chosen])
    sub = out[idx]
    out[idx] = torch.where(seen, torch.where(sub < 0, sub * penalty, sub / penalty), sub)


def _penalize_output(out: torch.Tensor, rows: Sequence[History]) -> None:
    """Step 4 on the rows with a frequency or presence penalty (output tokens only)."""
    chosen = [
        i for i, r in enumerate(rows) if r.params.frequency_penalty or r.params.presence_penalty
    ]
    if not chosen:
        return
    idx = torch.tensor(chosen, device=out.device)
    outputs = [rows[i].token_ids[rows[i].num_prompt_tokens :] for i in chosen]
    counts = _token_counts(outputs, out.shape[-1], out.dtype, out.device)
    frequency = _per_row(out, [rows[i].params.frequency_penalty for i in chosen])
    presence = _per_row(out, [rows[i].params.presence_penalty for i in chosen])
    out[idx] -= frequency * counts + presence * (counts > 0).to(out.dtype)

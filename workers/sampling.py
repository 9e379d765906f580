"""Turning logits into tokens: greedy, temperature, top-k, top-p, per-request seeds.

Filters run batched over the rows; only the final draw loops over the sampled rows, each
with its own ``torch.Generator`` when the request has a seed, so a seeded request draws the
same tokens whatever else shares its batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from workers.sequence import SamplingParams


def _filter_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """Mask (to -inf) what top-k/top-p exclude, per row. ``top_k`` 0 disables it."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    vocab = logits.shape[-1]
    ranks = torch.arange(vocab, device=logits.device).expand_as(sorted_logits)
    k = torch.where(top_k > 0, top_k, vocab).unsqueeze(1)
    drop = ranks >= k
    probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
    # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
    drop |= (probs.cumsum(dim=-1) - probs) >= top_p.unsqueeze(1)
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


def sample(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
) -> list[int]:
    """One token per row of fp32 ``logits`` ``[N, vocab]``."""
    tokens = logits.argmax(dim=-1)
    rows = [i for i, p in enumerate(params) if not p.greedy]
    if rows:
        idx = torch.tensor(rows, device=logits.device)
        sub = logits[idx]
        temps = torch.tensor([params[i].temperature for i in rows], device=logits.device)
        sub = sub / temps.unsqueeze(1)
        top_k = torch.tensor([params[i].top_k for i in rows], device=logits.device)
        top_p = torch.tensor([params[i].top_p for i in rows], device=logits.device)
        if bool((top_k > 0).any()) or bool((top_p < 1).any()):
            sub = _filter_top_k_top_p(sub, top_k, top_p)
        probs = sub.softmax(dim=-1)
        for j, i in enumerate(rows):
            draw = torch.multinomial(probs[j], 1, generator=generators[i])
            tokens[i] = draw[0]
    return [int(t) for t in tokens.tolist()]


def make_generator(seed: int | None, device: torch.device) -> torch.Generator | None:
    """A generator seeded for one request, or ``None`` to use the global RNG."""
    if seed is None:
        return None
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g

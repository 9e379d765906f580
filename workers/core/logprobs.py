"""Log-probabilities of tokens under the model's raw distribution (OpenAI's ``logprobs``).

A token's logprob is the log-softmax of the model's fp32 logits at the position that
predicted it, before temperature, penalties, bias or top-k/top-p: what transformers'
``log_softmax(logits)`` gives for the same ids (vLLM's default, ``raw_logprobs``), so
evaluation harnesses score the model, not the sampler. :func:`token_logprobs` computes
them for a batch of rows at once, with one host copy per tensor (no per-row syncs).

The model runner asks for them in two places: the sampled rows of requests with
``logprobs`` (:func:`sampled_logprobs`), and, for requests with ``prompt_logprobs``, every
row of their prefill chunks that predicts a prompt token (:func:`plan_prompt_rows` when the
step is flattened, :func:`prompt_logprobs` after the model ran).
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence as Sequence_
from dataclasses import dataclass, field

import torch

from workers.core.sequence import Sequence, TokenLogprob


def token_logprobs(
    logits: torch.Tensor, token_ids: torch.Tensor | list[int], top_k: int
) -> list[TokenLogprob]:
    """For each row of ``logits`` ``[R, vocab]``, the logprob of ``token_ids[r]`` and the
    ``top_k`` best (``top_k`` 0: none); computed in fp32 whatever the logits' dtype."""
    if logits.shape[0] == 0:
        return []
    ids = torch.as_tensor(token_ids, dtype=torch.long, device=logits.device)
    logp = logits.float().log_softmax(dim=-1)
    chosen = logp.gather(1, ids.unsqueeze(1)).squeeze(1).tolist()
    if top_k <= 0:
        return [TokenLogprob(v) for v in chosen]
    values, indices = logp.topk(min(top_k, logp.shape[-1]), dim=-1)
    return [
        TokenLogprob(v, tuple(i), tuple(t))
        for v, i, t in zip(chosen, indices.tolist(), values.tolist(), strict=True)
    ]


@dataclass
class PromptRows:
    """The rows of one step that predict prompt tokens of ``seq`` (which wants its prompt's
    logprobs): ``rows`` into the step's hidden states, ``targets`` the tokens they predict."""

    seq: Sequence
    rows: list[int] = field(default_factory=list)
    targets: list[int] = field(default_factory=list)


def plan_prompt_rows(seq: Sequence, start: int, n: int, base: int) -> PromptRows | None:
    """The rows of ``seq``'s chunk (positions ``start .. start + n - 1`` at rows ``base``
    onward) whose logits give prompt logprobs not recorded yet (a request recomputed after
    preemption records each position once); None when it wants none or has none here."""
    if seq.params.prompt_logprobs is None:
        return None
    first = max(start, len(seq.prompt_logprobs))
    last = min(start + n, seq.num_prompt_tokens - 1)  # position p predicts token p + 1
    if first >= last:
        return None
    rows = list(range(base + first - start, base + last - start))
    return PromptRows(seq, rows, seq.token_ids[first + 1 : last + 1])


def prompt_logprobs(
    hidden: torch.Tensor,
    plans: list[PromptRows],
    to_logits: Callable[[torch.Tensor], torch.Tensor],
) -> list[tuple[Sequence, list[TokenLogprob]]]:
    """Each planned sequence's new prompt logprobs, from the step's ``hidden`` states
    (``to_logits``: the model's head), with its own number of alternatives; computed for
    every plan at once (one host copy per tensor, however many sequences)."""
    if not plans:
        return []
    rows = [r for p in plans for r in p.rows]
    logits = to_logits(hidden[torch.tensor(rows, device=hidden.device)])
    k = max(p.seq.params.prompt_logprobs or 0 for p in plans)
    got = token_logprobs(logits, [t for p in plans for t in p.targets], k)
    out: list[tuple[Sequence, list[TokenLogprob]]] = []
    at = 0
    for plan in plans:
        keep = plan.seq.params.prompt_logprobs or 0
        out.append((plan.seq, [_trimmed(lp, keep) for lp in got[at : at + len(plan.rows)]]))
        at += len(plan.rows)
    return out


def sampled_logprobs(
    logits: torch.Tensor, rows: Sequence_[Sequence], seqs: list[Sequence], tokens: list[int]
) -> list[TokenLogprob | None]:
    """The logprob of each sampled token (``tokens[i]`` of ``seqs[i]``, whose logits are
    row ``rows.index(seqs[i])``), or None where its request did not ask."""
    wanted = [i for i, s in enumerate(seqs) if s.params.logprobs is not None]
    out: list[TokenLogprob | None] = [None] * len(seqs)
    if not wanted:
        return out
    index = {id(s): r for r, s in enumerate(rows)}
    at = torch.tensor([index[id(seqs[i])] for i in wanted], device=logits.device)
    k = max(seqs[i].params.logprobs or 0 for i in wanted)
    got = token_logprobs(logits[at], [tokens[i] for i in wanted], k)
    for i, lp in zip(wanted, got, strict=True):
        out[i] = _trimmed(lp, seqs[i].params.logprobs or 0)
    return out


def _trimmed(lp: TokenLogprob, keep: int) -> TokenLogprob:
    """``lp`` with only its ``keep`` best alternatives (a batch computes the most any row
    asked for)."""
    return TokenLogprob(lp.logprob, lp.top_ids[:keep], lp.top_logprobs[:keep])

"""vLLM's outputs as our engine's (:class:`workers.core.outputs.RequestOutput`), for one call.

vLLM runs a call with ``detokenize=False`` and without stop strings; :class:`CallOutputs`
releases the text exactly as our engine does (:class:`workers.core.detokenizer.IncrementalText`
over our tokenizer's ``TextStream``, the same stop strings and ``min_tokens``), so a
client sees the same text and the same stop whichever engine served it. Tokens the request
made elsewhere (the first token of a remote prefill; the outputs a resumed request already
had) are pushed first and count as released, as on our engine.

Finish reasons: a stop string found here ends the call as ``stop`` (the worker then aborts
vLLM's request); otherwise vLLM's reason: ``stop`` (EOS unless ``ignore_eos``, or a stop
token), ``length`` (``max_tokens`` or the model length), ``abort``. Logprobs are vLLM's
raw ones: the token's own and its ``k`` most likely alternatives, best first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from workers.core.detokenizer import IncrementalText, TokenStream
from workers.core.outputs import RequestOutput
from workers.core.sequence import FinishReason, SamplingParams, TokenLogprob

REASONS = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH}
"""vLLM's finish reason -> ours (any other, e.g. ``abort`` or ``error``: ``abort``)."""


def token_logprob(token: int, entry: Mapping[int, Any], k: int) -> TokenLogprob:
    """One position's vLLM logprobs (``{token id: Logprob(logprob, rank, ...)}``, the
    chosen token and the top ones) as ours: ``token``'s logprob and the top ``k``."""
    top = sorted(
        ((i, lp) for i, lp in entry.items() if lp.rank is not None and lp.rank <= k),
        key=lambda item: item[1].rank,
    )[:k]
    return TokenLogprob(
        float(entry[token].logprob),
        tuple(int(i) for i, _ in top),
        tuple(float(lp.logprob) for _, lp in top),
    )


def prompt_logprobs(
    prompt: Sequence[int], entries: Sequence[Mapping[int, Any] | None], k: int
) -> list[TokenLogprob]:
    """vLLM's prompt logprobs (``None`` for the first token) for prompt tokens 2..n."""
    return [
        token_logprob(token, entry, k)
        for token, entry in zip(prompt[1:], entries[1:], strict=False)
        if entry is not None
    ]


class CallOutputs:
    """The outputs of one call (module docstring): ``stream`` is this request's own text
    stream, ``earlier`` the output tokens it made elsewhere, ``prompt`` its prompt.

    ``handoff_within`` (a model length): the call is a prefill whose request goes on on a
    decode worker, capped at one token. Its ``length`` then means a hand-off
    (:attr:`FinishReason.HANDOFF`) unless the request really ends there (``max_tokens`` 1,
    the model length), and a hand-off keeps the text held back for a stop string: the
    decode worker, pushing the same token, releases it."""

    def __init__(
        self,
        request_id: str,
        stream: TokenStream,
        params: SamplingParams,
        prompt: Sequence[int],
        earlier: Sequence[int] = (),
        handoff_within: int = 0,
    ) -> None:
        self.request_id = request_id
        self.params = params
        self.prompt = list(prompt)
        self.handoff = bool(handoff_within) and params.max_tokens > 1
        self.handoff = self.handoff and len(self.prompt) + 1 < handoff_within
        self.texts = IncrementalText(stream, params.stop, params.min_tokens)
        self.texts.push(list(earlier))  # released where they were made
        self.tokens = list(earlier)
        self.finished = False

    def step(
        self, new: Sequence[int], logprobs: Sequence[Mapping[int, Any]] | None, reason: str | None
    ) -> RequestOutput:
        """The output for vLLM's next delta: its ``new`` tokens (their ``logprobs``), and
        vLLM's finish ``reason`` when it says the request ended."""
        taken: list[int] = []
        delta = ""
        for token in new:
            delta += self.texts.push([token])
            taken.append(token)
            if self.texts.stopped:
                break
        finish = FinishReason.STOP if self.texts.stopped else None
        if finish is None and reason is not None:
            finish = REASONS.get(reason, FinishReason.ABORT)
            if finish is FinishReason.LENGTH and self.handoff:
                finish = FinishReason.HANDOFF
        text = None
        self.finished = finish is not None
        if finish is not None and finish is not FinishReason.HANDOFF:
            delta += self.texts.finish()
            text = self.texts.text
        self.tokens += taken
        k = self.params.logprobs
        return RequestOutput(
            request_id=self.request_id,
            prompt_token_ids=self.prompt,
            output_token_ids=list(self.tokens),
            new_token_ids=taken,
            finished=finish is not None,
            finish_reason=finish,
            text=text,
            text_delta=delta,
            logprobs=[token_logprob(t, e, k) for t, e in zip(taken, logprobs or (), strict=False)]
            if k is not None
            else [],
        )

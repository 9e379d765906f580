"""Tokens' logprobs in OpenAI's two answer shapes.

A completion choice's ``logprobs`` (the legacy shape lm-evaluation-harness reads):
``tokens`` (each token's own text), ``token_logprobs``, ``top_logprobs`` (per token a
map from text to logprob of its most likely alternatives and of the token itself, as vLLM
gives it, so a harness can tell whether the token was the greedy one) and ``text_offset``
(where each token's text starts in the choice's text). An echoed prompt's first token has
no logprob: ``null`` in both lists. A chat choice's ``logprobs`` is ``{"content": [...]}``
with per token ``token``, ``logprob``, ``bytes`` and exactly ``top_logprobs``
alternatives. Values are the workers' (:mod:`workers.core.logprobs`), unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from proto import worker_pb2 as pb

TokenTexts = Callable[[Sequence[int]], list[str]]
"""Each token id's own text (decoded alone), in order."""


def _texts(
    ids: Sequence[int], logprobs: Sequence[pb.TokenLogprob | None], texts: TokenTexts
) -> dict[int, str]:
    """The text of every id that will be shown: the tokens' and their alternatives'."""
    wanted = list(dict.fromkeys([*ids, *(t for lp in logprobs if lp for t in lp.top_ids)]))
    return dict(zip(wanted, texts(wanted), strict=True))


@dataclass
class CompletionLogprobs:
    """Builds one completion choice's ``logprobs`` part by part (a stream's chunks share
    the text offsets); ``offset``: where the next token's text starts."""

    texts: TokenTexts
    offset: int = 0

    def part(
        self, ids: Sequence[int], logprobs: Sequence[pb.TokenLogprob | None]
    ) -> dict[str, Any]:
        """The ``logprobs`` object of tokens ``ids`` (``logprobs[i]`` is ``ids[i]``'s,
        None where there is none: an echoed prompt's first token)."""
        text = _texts(ids, logprobs, self.texts)
        out: dict[str, Any] = {
            "tokens": [],
            "token_logprobs": [],
            "top_logprobs": [],
            "text_offset": [],
        }
        for token, lp in zip(ids, logprobs, strict=True):
            out["tokens"].append(text[token])
            out["text_offset"].append(self.offset)
            self.offset += len(text[token])
            if lp is None:
                out["token_logprobs"].append(None)
                out["top_logprobs"].append(None)
                continue
            out["token_logprobs"].append(lp.logprob)
            top = {text[t]: v for t, v in zip(lp.top_ids, lp.top_logprobs, strict=True)}
            top.setdefault(text[token], lp.logprob)
            out["top_logprobs"].append(top)
        return out


def chat_logprobs(
    ids: Sequence[int], logprobs: Sequence[pb.TokenLogprob], texts: TokenTexts
) -> dict[str, Any]:
    """A chat choice's ``logprobs`` for tokens ``ids``."""
    text = _texts(ids, logprobs, texts)

    def entry(token: int, value: float) -> dict[str, Any]:
        return {"token": text[token], "logprob": value, "bytes": list(text[token].encode())}

    content = []
    for token, lp in zip(ids, logprobs, strict=True):
        item = entry(token, lp.logprob)
        item["top_logprobs"] = [
            entry(t, v) for t, v in zip(lp.top_ids, lp.top_logprobs, strict=True)
        ]
        content.append(item)
    return {"content": content}

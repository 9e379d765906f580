"""OpenAI response bodies and server-sent events for one request.

Completions are ``text_completion`` objects (the stream's chunks too); chat completions are
``chat.completion`` objects, streamed as ``chat.completion.chunk`` (a first chunk with the
assistant role, content deltas, a last chunk with ``finish_reason``). With
``stream_options.include_usage`` every chunk has ``"usage": null`` and one more chunk with
no choices carries the usage. With vLLM's ``return_token_ids`` the answer carries token
ids (:class:`Formatter`). Every event is ``data: <json>\\n\\n``; the stream ends with
``data: [DONE]\\n\\n``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from proto import worker_pb2 as pb
from proto.tokenization import Tokenizer
from router.api.logprob_format import CompletionLogprobs, TokenTexts, chat_logprobs
from router.flow.admitted import AdmittedRequest
from router.flow.types import Chunk, Usage

DONE = b"data: [DONE]\n\n"


def sse(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


def joined_usage(usages: Sequence[Usage | None]) -> Usage | None:
    """The usage of ``n`` samples of one prompt: the prompt counted once (its cached part
    as the first sample saw it), every sample's output."""
    if not usages or usages[0] is None:
        return None
    first = usages[0]
    output = sum(u.completion_tokens for u in usages if u is not None)
    return Usage(first.prompt_tokens, output, first.cached_tokens)


def usage_json(usage: Usage | None) -> dict[str, Any] | None:
    if usage is None:
        return None
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


@dataclass(frozen=True)
class Formatter:
    """Builds the bodies of one request; ``chat`` picks the chat completion shapes.

    With ``return_token_ids`` (vLLM's extension) the answer carries token ids where vLLM
    puts them: every choice has ``token_ids``, the generated ids exactly as sampled (the
    whole answer's; in a stream each chunk's own, so that the chunks' lists concatenated
    are the whole answer's), and ``prompt_token_ids`` holds :attr:`prompt_token_ids`, the
    prompt's ids as the router tokenized them: on the choice for a completion (streamed:
    the first chunk's choice), on the response object for a chat (streamed: the first
    chunk, the assistant role's, whose choice has no ``token_ids``). A chunk of the flow
    with token ids and no text is sent too then (and when logprobs are asked for), so that
    no id is lost. Without it the bodies have neither field.

    With ``n`` samples every choice carries its ``index``; a stream interleaves their
    chunks. With ``logprobs`` (alternatives per token; None: off) each choice carries its
    tokens' logprobs (:mod:`router.api.logprob_format`; ``token_texts`` names the tokens). A
    completion with ``echo`` starts its text (streamed: its first chunk's) with
    ``prompt_text`` and, with logprobs, its logprobs with the prompt's.
    """

    chat: bool
    response_id: str
    model: str
    include_usage: bool = False
    return_token_ids: bool = False
    prompt_token_ids: tuple[int, ...] = ()
    created: int = field(default_factory=lambda: int(time.time()))
    logprobs: int | None = None
    echo: bool = False
    prompt_text: str = ""
    token_texts: TokenTexts = field(default=lambda ids: [str(i) for i in ids])
    _cursors: dict[int, CompletionLogprobs] = field(default_factory=dict)

    @classmethod
    def of(cls, admitted: AdmittedRequest, tokenizer: Tokenizer | None = None) -> Formatter:
        """The formatter of ``admitted``'s answer (``tokenizer`` names tokens and the
        echoed prompt; needed for logprobs and echo)."""
        prompt = admitted.prompt_text
        if prompt is None and admitted.echo and tokenizer is not None:
            prompt = tokenizer.decode(list(admitted.prompt_token_ids), skip_special_tokens=False)
        fmt = cls(
            admitted.chat,
            admitted.response_id,
            admitted.model,
            admitted.include_usage,
            admitted.return_token_ids,
            admitted.prompt_token_ids,
            logprobs=admitted.logprobs,
            echo=admitted.echo,
            prompt_text=prompt or "",
        )
        if tokenizer is not None:
            return replace(fmt, token_texts=tokenizer.token_texts)
        return fmt

    def response(self, answers: Sequence[Chunk]) -> dict[str, Any]:
        """The whole (non-streamed) answer: ``answers[i]`` holds sample ``i``'s chunks
        joined (:func:`router.api.streaming.collect`); the usage counts the prompt once and
        every sample's output."""
        choices = []
        for index, answer in enumerate(answers):
            choice = self._choice(answer.finish_reason, index)
            if self.chat:
                choice["message"] = {"role": "assistant", "content": answer.text}
            else:
                choice["text"] = self._echoed(answer.text, first=True)
            self._add_logprobs(choice, answer, index, first=True)
            self._add_ids(None, choice, answer.token_ids, with_prompt=not self.chat)
            choices.append(choice)
        usage = usage_json(joined_usage([a.usage for a in answers]))
        body = {**self._head(streamed=False), "choices": choices, "usage": usage}
        self._add_ids(body, None, None, with_prompt=self.chat)
        return body

    def start_events(self, n: int = 1) -> list[bytes]:
        """Events before the flows' first chunks: each sample's assistant role, for chat
        (with the prompt's ids when asked for)."""
        if not self.chat:
            return []
        return [
            self._chunk({"role": "assistant", "content": ""}, None, None, i, with_prompt=True)
            for i in range(n)
        ]

    def chunk_events(self, chunk: Chunk, first: bool = False, index: int = 0) -> list[bytes]:
        """Events for one chunk of sample ``index``'s flow (``first``: its first, which
        carries a completion's prompt ids and echo when asked for); the finishing one
        carries ``finish_reason``. A chunk with no text and no finish reason sends nothing,
        unless token ids or logprobs were asked for and it has tokens (or it is a
        completion's first)."""
        text, finish, ids = chunk.text, chunk.finish_reason, chunk.token_ids
        wants_ids = self.return_token_ids or self.logprobs is not None
        shown = bool(text) or (wants_ids and bool(ids))
        if not self.chat:
            if shown or finish is not None or (first and (wants_ids or self.echo)):
                text = self._echoed(text, first)
                return [self._chunk(text, finish, ids, index, first, chunk)]
            return []
        events = [self._chunk({"content": text}, None, ids, index, chunk=chunk)] if shown else []
        if finish is not None:
            events.append(self._chunk({}, finish, (), index))
        return events

    def end_events(self, usage: Usage | None) -> list[bytes]:
        """The usage chunk (if asked for), then ``[DONE]``."""
        if not self.include_usage:
            return [DONE]
        return [sse({**self._head(streamed=True), "choices": [], "usage": usage_json(usage)}), DONE]

    def _chunk(
        self,
        content: str | dict[str, Any],
        finish_reason: str | None,
        token_ids: tuple[int, ...] | None,
        index: int,
        with_prompt: bool = False,
        chunk: Chunk | None = None,
    ) -> bytes:
        choice = self._choice(finish_reason, index)
        choice["delta" if self.chat else "text"] = content
        if chunk is not None:
            self._add_logprobs(choice, chunk, index, first=with_prompt)
        body = {**self._head(streamed=True), "choices": [choice]}
        if self.include_usage:
            body["usage"] = None
        self._add_ids(body, choice, token_ids, with_prompt)
        return sse(body)

    def _echoed(self, text: str, first: bool) -> str:
        return self.prompt_text + text if self.echo and first else text

    def _add_logprobs(self, choice: dict[str, Any], chunk: Chunk, index: int, first: bool) -> None:
        """``choice``'s logprobs for ``chunk``'s tokens (with the echoed prompt's first)."""
        if self.logprobs is None:
            return
        if self.chat:
            choice["logprobs"] = chat_logprobs(chunk.token_ids, chunk.logprobs, self.token_texts)
            return
        cursor = self._cursors.setdefault(index, CompletionLogprobs(self.token_texts))
        ids: list[int] = []
        values: list[pb.TokenLogprob | None] = []
        if self.echo and first:
            ids += self.prompt_token_ids
            values += [None, *chunk.prompt_logprobs]
        ids += chunk.token_ids
        values += chunk.logprobs
        choice["logprobs"] = cursor.part(ids, values)

    @staticmethod
    def _choice(finish_reason: str | None, index: int) -> dict[str, Any]:
        return {"index": index, "logprobs": None, "finish_reason": finish_reason}

    def _add_ids(
        self,
        body: dict[str, Any] | None,
        choice: dict[str, Any] | None,
        token_ids: tuple[int, ...] | None,
        with_prompt: bool,
    ) -> None:
        """When token ids were asked for: ``token_ids`` on ``choice`` (unless None), and
        with ``with_prompt`` the prompt's ids, where vLLM places them (class docstring)."""
        if not self.return_token_ids:
            return
        if choice is not None and token_ids is not None:
            choice["token_ids"] = list(token_ids)
        where = body if self.chat else choice
        if with_prompt and where is not None:
            where["prompt_token_ids"] = list(self.prompt_token_ids)

    def _head(self, streamed: bool) -> dict[str, Any]:
        kind = "chat.completion" if self.chat else "text_completion"
        if self.chat and streamed:
            kind = "chat.completion.chunk"
        return {
            "id": self.response_id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
        }

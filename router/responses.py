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
from dataclasses import dataclass, field
from typing import Any

from router.admitted import AdmittedRequest
from router.flow_types import Chunk, Usage

DONE = b"data: [DONE]\n\n"


def sse(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


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
    with token ids and no text is sent too then, so that no id is lost. Without it the
    bodies have neither field.
    """

    chat: bool
    response_id: str
    model: str
    include_usage: bool = False
    return_token_ids: bool = False
    prompt_token_ids: tuple[int, ...] = ()
    created: int = field(default_factory=lambda: int(time.time()))

    @classmethod
    def of(cls, admitted: AdmittedRequest) -> Formatter:
        """The formatter of ``admitted``'s answer."""
        return cls(
            admitted.chat,
            admitted.response_id,
            admitted.model,
            admitted.include_usage,
            admitted.return_token_ids,
            admitted.prompt_token_ids,
        )

    def response(self, answer: Chunk) -> dict[str, Any]:
        """The whole (non-streamed) answer: ``answer`` holds every chunk's text and token
        ids joined, and the last chunk's finish reason and usage
        (:func:`router.streaming.collect`)."""
        choice = self._choice(answer.finish_reason)
        if self.chat:
            choice["message"] = {"role": "assistant", "content": answer.text}
        else:
            choice["text"] = answer.text
        usage = usage_json(answer.usage)
        body = {**self._head(streamed=False), "choices": [choice], "usage": usage}
        self._add_ids(body, choice, answer.token_ids, with_prompt=True)
        return body

    def start_events(self) -> list[bytes]:
        """Events before the flow's first chunk: the assistant role, for chat (with the
        prompt's ids when asked for)."""
        if not self.chat:
            return []
        return [self._chunk({"role": "assistant", "content": ""}, None, None, with_prompt=True)]

    def chunk_events(self, chunk: Chunk, first: bool = False) -> list[bytes]:
        """Events for one chunk of the flow (``first``: the flow's first, which carries a
        completion's prompt ids when asked for); the finishing one carries
        ``finish_reason``. A chunk with no text and no finish reason sends nothing, unless
        token ids were asked for and it has some (or it is a completion's first)."""
        text, finish, ids = chunk.text, chunk.finish_reason, chunk.token_ids
        shown = bool(text) or (self.return_token_ids and bool(ids))
        if not self.chat:
            if shown or finish is not None or (first and self.return_token_ids):
                return [self._chunk(text, finish, ids, with_prompt=first)]
            return []
        events = [self._chunk({"content": text}, None, ids)] if shown else []
        if finish is not None:
            events.append(self._chunk({}, finish, ()))
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
        with_prompt: bool = False,
    ) -> bytes:
        choice = self._choice(finish_reason)
        choice["delta" if self.chat else "text"] = content
        body = {**self._head(streamed=True), "choices": [choice]}
        if self.include_usage:
            body["usage"] = None
        self._add_ids(body, choice, token_ids, with_prompt)
        return sse(body)

    @staticmethod
    def _choice(finish_reason: str | None) -> dict[str, Any]:
        return {"index": 0, "logprobs": None, "finish_reason": finish_reason}

    def _add_ids(
        self,
        body: dict[str, Any],
        choice: dict[str, Any],
        token_ids: tuple[int, ...] | None,
        with_prompt: bool,
    ) -> None:
        """When token ids were asked for: ``token_ids`` on ``choice`` (unless None), and
        with ``with_prompt`` the prompt's ids, where vLLM places them (class docstring)."""
        if not self.return_token_ids:
            return
        if token_ids is not None:
            choice["token_ids"] = list(token_ids)
        if with_prompt:
            (body if self.chat else choice)["prompt_token_ids"] = list(self.prompt_token_ids)

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

"""OpenAI response bodies and server-sent events for one request.

Completions are ``text_completion`` objects (the stream's chunks too); chat completions are
``chat.completion`` objects, streamed as ``chat.completion.chunk`` (a first chunk with the
assistant role, content deltas, a last chunk with ``finish_reason``). With
``stream_options.include_usage`` every chunk has ``"usage": null`` and one more chunk with
no choices carries the usage. Every event is ``data: <json>\\n\\n``; the stream ends with
``data: [DONE]\\n\\n``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from router.flow_types import Usage

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
    """Builds the bodies of one request; ``chat`` picks the chat completion shapes."""

    chat: bool
    response_id: str
    model: str
    include_usage: bool = False
    created: int = field(default_factory=lambda: int(time.time()))

    def response(self, text: str, finish_reason: str | None, usage: Usage | None) -> dict[str, Any]:
        """The whole (non-streamed) answer."""
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish_reason}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return {**self._head(streamed=False), "choices": [choice], "usage": usage_json(usage)}

    def start_events(self) -> list[bytes]:
        """Events before the first text: the assistant role, for chat."""
        return [self._chunk({"role": "assistant", "content": ""}, None)] if self.chat else []

    def text_events(self, text: str, finish_reason: str | None) -> list[bytes]:
        """Events for new text; the finishing one carries ``finish_reason``."""
        if not self.chat:
            return [self._chunk(text, finish_reason)] if text or finish_reason else []
        events = [self._chunk({"content": text}, None)] if text else []
        if finish_reason is not None:
            events.append(self._chunk({}, finish_reason))
        return events

    def end_events(self, usage: Usage | None) -> list[bytes]:
        """The usage chunk (if asked for), then ``[DONE]``."""
        if not self.include_usage:
            return [DONE]
        return [sse({**self._head(streamed=True), "choices": [], "usage": usage_json(usage)}), DONE]

    def _chunk(self, content: str | dict[str, Any], finish_reason: str | None) -> bytes:
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish_reason}
        choice["delta" if self.chat else "text"] = content
        body = {**self._head(streamed=True), "choices": [choice]}
        if self.include_usage:
            body["usage"] = None
        return sse(body)

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

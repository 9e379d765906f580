"""The answer's bodies (:class:`router.api.responses.Formatter`), whole and streamed through
:func:`router.api.streaming.sse_events`, with and without vLLM's ``return_token_ids``: where the
ids go, that the streamed ids add up to the answer's, and that no body changes without it.
Bodies are read back with the official ``openai`` package's types."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from router.api.responses import Formatter
from router.api.streaming import collect, sse_events
from router.flow.types import Chunk, Usage

PROMPT = (5, 6, 7)
USAGE = Usage(prompt_tokens=3, completion_tokens=5, cached_tokens=0)
CHUNKS = (
    Chunk("He", (11,)),
    Chunk("", (12,)),  # held back (e.g. half a character): ids, no text yet
    Chunk("llo", (13, 14)),
    Chunk(" you", (15,), "length", USAGE),
)
IDS = [11, 12, 13, 14, 15]


def formatter(chat: bool, ids: bool, usage: bool = False) -> Formatter:
    return Formatter(chat, "id-1", "m", usage, return_token_ids=ids, prompt_token_ids=PROMPT)


async def _chunks(chunks: Sequence[Chunk]) -> AsyncIterator[tuple[int, Chunk]]:
    for chunk in chunks:
        yield 0, chunk


def streamed(fmt: Formatter, chunks: Sequence[Chunk] = CHUNKS) -> list[dict[str, Any]]:
    """The JSON events of a stream of ``chunks`` (``[DONE]`` checked and dropped)."""

    async def run() -> list[bytes]:
        rest = _chunks(chunks[1:])
        return [event async for event in sse_events((0, chunks[0]), rest, fmt)]

    events = asyncio.run(run())
    assert events[-1] == b"data: [DONE]\n\n"
    return [json.loads(e.removeprefix(b"data: ")) for e in events[:-1]]


def whole(fmt: Formatter) -> dict[str, Any]:
    return fmt.response(asyncio.run(collect(_chunks(CHUNKS))))


def test_collect_joins_every_chunks_text_and_ids() -> None:
    (answer,) = asyncio.run(collect(_chunks(CHUNKS)))
    assert answer == Chunk("Hello you", tuple(IDS), "length", USAGE)


def test_a_completion_carries_its_ids_and_the_prompts_on_the_choice() -> None:
    body = whole(formatter(chat=False, ids=True))
    (choice,) = Completion.model_validate(body).choices
    assert choice.text == "Hello you"
    assert choice.model_extra == {"token_ids": IDS, "prompt_token_ids": list(PROMPT)}


def test_a_chat_carries_its_ids_on_the_choice_and_the_prompts_on_the_response() -> None:
    reply = ChatCompletion.model_validate(whole(formatter(chat=True, ids=True)))
    (choice,) = reply.choices
    assert choice.message.content == "Hello you"
    assert choice.model_extra == {"token_ids": IDS}
    assert reply.model_extra == {"prompt_token_ids": list(PROMPT)}


def test_a_streamed_completion_has_each_chunks_ids_and_the_prompts_first() -> None:
    events = streamed(formatter(chat=False, ids=True, usage=True))
    # (the openai package's Completion wants a finish reason: streams are read unchecked)
    choices = [e["choices"][0] for e in events if e["choices"]]
    assert [c["text"] for c in choices] == ["He", "", "llo", " you"]  # the id-only one is sent
    assert [t for c in choices for t in c["token_ids"]] == IDS
    prompts = [c.get("prompt_token_ids") for c in choices]
    assert prompts == [list(PROMPT), None, None, None]
    assert [c["finish_reason"] for c in choices] == [None, None, None, "length"]
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 5


def test_a_streamed_chat_has_the_prompts_on_the_role_chunk_and_each_chunks_ids() -> None:
    events = streamed(formatter(chat=True, ids=True))
    chunks = [ChatCompletionChunk.model_validate(e) for e in events]
    role, *content, last = chunks
    assert role.choices[0].delta.role == "assistant"
    assert role.model_extra == {"prompt_token_ids": list(PROMPT)}
    assert "token_ids" not in (role.choices[0].model_extra or {})
    assert all("prompt_token_ids" not in (c.model_extra or {}) for c in (*content, last))
    assert "".join(c.choices[0].delta.content or "" for c in content) == "Hello you"
    ids = [t for c in (*content, last) for t in (c.choices[0].model_extra or {})["token_ids"]]
    assert ids == IDS
    assert last.choices[0].finish_reason == "length"


def test_a_first_chunk_with_nothing_still_carries_a_completions_prompt_ids() -> None:
    events = streamed(formatter(chat=False, ids=True), [Chunk("", ()), Chunk("a", (9,), "stop")])
    assert [e["choices"][0].get("prompt_token_ids") for e in events] == [list(PROMPT), None]
    assert [e["choices"][0]["token_ids"] for e in events] == [[], [9]]


def test_without_the_field_no_body_has_token_ids() -> None:
    for chat in (False, True):
        fmt = formatter(chat=chat, ids=False, usage=True)
        bodies = [whole(fmt), *streamed(fmt)]
        assert "token_ids" not in json.dumps(bodies)
        texts = [e["choices"][0].get("text", "") for e in bodies[1:-1] if not chat]
        assert "" not in texts  # an id-only chunk sends nothing when ids were not asked for

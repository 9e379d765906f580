""":func:`run_conversations` over real HTTP against a small aiohttp stand-in for a server:
what each turn's body asks for (token ids in, ``return_token_ids``), and a server without
the extension stopping the whole run with the field's name. Against the router itself:
tests/integration/test_bench_conversation.py."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiohttp import test_utils, web

from kvserve.loadgen.client import ClientOptions
from kvserve.loadgen.conversation import ConversationPlan
from kvserve.loadgen.conversation_client import TokenIdsMissingError, run_conversations
from kvserve.loadgen.metrics import RequestRecord

PLANS = [
    ConversationPlan(0, 0.0, (101, 102), ((201,),), (2, 2), (0.0,)),
    ConversationPlan(1, 0.0, (111,), ((211, 212),), (2, 2), (0.0,)),
]


def event(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data).encode() + b"\n\n"


def stand_in(bodies: list[dict[str, Any]], with_ids: bool) -> web.Application:
    """Streams two chunks per request, ids ``(prompt[0] + 1000, prompt[-1] + 2000)`` (when
    ``with_ids``), then usage; keeps every body."""

    async def complete(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        bodies.append(body)
        prompt = body["prompt"]
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for token in (prompt[0] + 1000, prompt[-1] + 2000):
            ids = {"token_ids": [token]} if with_ids else {}
            await response.write(event({"choices": [{"text": "x", **ids}]}))
        usage = {"prompt_tokens": len(prompt), "completion_tokens": 2}
        await response.write(event({"choices": [], "usage": usage}) + b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_post("/v1/completions", complete)
    return app


def converse_with(with_ids: bool) -> tuple[list[RequestRecord], list[dict[str, Any]]]:
    bodies: list[dict[str, Any]] = []

    async def run() -> list[RequestRecord]:
        async with test_utils.TestServer(stand_in(bodies, with_ids), host="127.0.0.1") as server:
            url = str(server.make_url(""))
            # a decoder and extras from the caller: prompts still travel as ids
            options = ClientOptions(text=lambda ids: "never", extra_body={"user": "u"})
            return await run_conversations(url, "m", PLANS, options=options, progress=False)

    return asyncio.run(run()), bodies


def test_each_turn_sends_ids_and_grows_by_the_returned_ids() -> None:
    records, bodies = converse_with(with_ids=True)
    assert [r.error for r in records] == [None] * 4
    assert all(b["return_token_ids"] is True and b["user"] == "u" for b in bodies)
    prompts = sorted(tuple(b["prompt"]) for b in bodies)
    assert prompts == [(101, 102), (101, 102, 1101, 2102, 201), (111,), (111, 1111, 2111, 211, 212)]
    assert [r.prompt_len for r in records] == [2, 5, 1, 5]


def test_a_server_without_token_ids_stops_the_run_naming_the_field() -> None:
    with pytest.raises(TokenIdsMissingError, match="return_token_ids"):
        converse_with(with_ids=False)

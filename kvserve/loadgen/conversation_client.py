"""Sends multi-turn conversations (:mod:`.conversation`) to an OpenAI-compatible server.

Each conversation is one task (:func:`converse`): it waits for its start, sends turn 0,
waits for the whole answer, thinks, sends turn 1, and so on; turns of different
conversations interleave, and each turn takes a concurrency slot only while it is in flight
(:class:`~.client.Sender`).

Prompts travel as **text**, through ``POST /v1/completions``: the router's completions API
streams the answer as text only (``logprobs``, ``return_token_ids`` and the like are
refused), so the answer's token ids cannot be appended. A turn's prompt is therefore the
previous turn's prompt text, then the answer's text exactly as streamed (every chunk's
``text``, concatenated), then the new user message: the messages are token ids decoded to
text by ``decode`` (the tokenizer of ``--tokenizer`` or the model). The client never
re-tokenizes; the server tokenizes the whole text, so the answer's part of the next prompt
is the server's tokenization of the text it generated, which may differ from the ids it
generated (the previous turn's prompt is the same text, so its tokens match up to the seam
at its end). A turn's record has ``prompt_len`` = the server's ``prompt_tokens`` (else the
client's count of the tokens the text was built from) and its ``arrival_s`` is the time it
became ready (:func:`~.conversation.ready_s`).

A failed turn ends its conversation: the turns after it are recorded as failed
(:func:`~.conversation.abandoned`).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Sequence

from kvserve.loadgen.client import ClientOptions, sending
from kvserve.loadgen.conversation import ConversationPlan, abandoned, grow, ready_s
from kvserve.loadgen.metrics import RequestRecord
from kvserve.loadgen.workloads import RequestSpec

SendTurn = Callable[[RequestSpec, str], Awaitable[tuple[RequestRecord, str]]]
"""Sends one turn (its spec, its prompt text): the record and the answer's text."""
Decode = Callable[[Sequence[int]], str]


async def converse(
    plan: ConversationPlan,
    send: SendTurn,
    decode: Decode,
    clock: Callable[[], float],
    sleep: Callable[[float], Awaitable[None]],
) -> list[RequestRecord]:
    """Every turn of ``plan``, in order (module docstring); ``clock`` is the run's clock,
    ``sleep`` waits that many seconds on it."""
    await sleep(max(0.0, plan.start_s - clock()))
    prompt, ready, planned = decode(plan.first), plan.start_s, len(plan.first)
    records: list[RequestRecord] = []
    for turn in range(plan.turns):
        record, answer = await send(plan.turn_spec(turn, ready), prompt)
        told = record.prompt_tokens
        records.append(dataclasses.replace(record, prompt_len=planned if told is None else told))
        if turn + 1 == plan.turns:
            break
        if not record.ok:
            return records + abandoned(plan, turn + 1, record.end_s)
        ready = ready_s(record.end_s, plan.think_s[turn])
        await sleep(max(0.0, ready - clock()))
        user = plan.users[turn]
        prompt = grow(prompt, answer, decode(user))
        planned += record.output_tokens + len(user)
    return records


async def run_conversations(
    base_url: str,
    model: str,
    plans: Sequence[ConversationPlan],
    concurrency: int = 0,
    *,
    options: ClientOptions,
    progress: bool = True,
    desc: str = "",
) -> list[RequestRecord]:
    """Every turn of every conversation of ``plans``; records in index order. ``options.text``
    decodes the messages (required: prompts are text)."""
    decode = options.text
    if decode is None:
        raise ValueError("conversations are sent as text: ClientOptions.text must decode ids")
    total = sum(p.turns for p in plans)
    async with sending(
        base_url, model, total, concurrency, options=options, progress=progress, desc=desc
    ) as sender:

        async def send(spec: RequestSpec, prompt: str) -> tuple[RequestRecord, str]:
            record, state = await sender.send(spec, prompt)
            return record, state.answer

        done = await asyncio.gather(
            *(converse(p, send, decode, sender.clock, asyncio.sleep) for p in plans)
        )
    return sorted((r for records in done for r in records), key=lambda r: r.index)

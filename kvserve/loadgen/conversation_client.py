"""Sends multi-turn conversations (:mod:`.conversation`) to an OpenAI-compatible server.

Each conversation is one task (:func:`converse`): it waits for its start, sends turn 0,
waits for the whole answer, thinks, sends turn 1, and so on; turns of different
conversations interleave, and each turn takes a concurrency slot only while it is in flight
(:class:`~.client.Sender`).

Prompts travel as **token ids**, through ``POST /v1/completions`` with vLLM's
``"return_token_ids": true``: the server streams each chunk's generated ids with its text
(``choices[0].token_ids``), and a turn's prompt is exactly the previous turn's prompt ids,
then the answer's ids as returned (every chunk's, concatenated), then the new user
message's ids (:func:`~.conversation.grow`). Nothing is decoded or re-tokenized, so every
prompt starts with the previous turn token for token, its answer as the model sampled it,
and a server's prefix cache can hit all of it. A turn's record has ``prompt_len`` = the
number of its prompt's ids and its ``arrival_s`` is the time it became ready
(:func:`~.conversation.ready_s`).

A server that answers a turn without ``token_ids`` (one without the extension), or with a
number of them other than its ``usage.completion_tokens``, fails the run:
:class:`TokenIdsMissingError` (a ``ValueError``: ``kvserve bench`` prints it as one line and
exits 2) names the field. There is no fallback to text: a text conversation's prompts
would hold the server's tokenization of its own answers, which is not what it generated,
and measure a different cache.

A failed turn ends its conversation: the turns after it are recorded as failed
(:func:`~.conversation.abandoned`).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Sequence

from kvserve.loadgen.client import ClientOptions, sending
from kvserve.loadgen.conversation import ConversationPlan, Tokens, abandoned, grow, ready_s
from kvserve.loadgen.metrics import RequestRecord
from kvserve.loadgen.workloads import RequestSpec

RETURN_TOKEN_IDS = {"return_token_ids": True}
"""What every turn's request adds to its body: vLLM's extension that returns the ids."""
SendTurn = Callable[[RequestSpec], Awaitable[tuple[RequestRecord, Tokens | None]]]
"""Sends one turn (its spec holds the prompt's ids): the record and the answer's token ids
as the server returned them (None: it returned no ``token_ids`` field)."""


class TokenIdsMissingError(ValueError):
    """A server answered a turn without its token ids (module docstring)."""


def answer_ids(record: RequestRecord, answer: Tokens | None) -> Tokens:
    """The ids of a completed turn's answer; :class:`TokenIdsMissingError` when the server
    sent none, or fewer or more than it reports generating (``usage``, when it reports)."""
    where = f"turn {record.turn} of conversation {record.conversation}"
    if answer is None:
        raise TokenIdsMissingError(
            f"the server answered {where} without token_ids: conversations send the answer's "
            'token ids back and need vLLM\'s extension "return_token_ids": true '
            "(choices[0].token_ids in each streamed chunk)"
        )
    if record.prompt_tokens is not None and len(answer) != record.output_tokens:
        raise TokenIdsMissingError(
            f"the server answered {where} with {len(answer)} token_ids for "
            f"{record.output_tokens} completion tokens"
        )
    return answer


async def converse(
    plan: ConversationPlan,
    send: SendTurn,
    clock: Callable[[], float],
    sleep: Callable[[float], Awaitable[None]],
) -> list[RequestRecord]:
    """Every turn of ``plan``, in order (module docstring); ``clock`` is the run's clock,
    ``sleep`` waits that many seconds on it."""
    await sleep(max(0.0, plan.start_s - clock()))
    prompt, ready = plan.first, plan.start_s
    records: list[RequestRecord] = []
    for turn in range(plan.turns):
        record, answer = await send(plan.turn_spec(turn, ready, prompt))
        records.append(record)
        if not record.ok:
            return records + abandoned(plan, turn + 1, record.end_s)
        ids = answer_ids(record, answer)
        if turn + 1 == plan.turns:
            break
        ready = ready_s(record.end_s, plan.think_s[turn])
        await sleep(max(0.0, ready - clock()))
        prompt = grow(prompt, ids, plan.users[turn])
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
    """Every turn of every conversation of ``plans``; records in index order. Prompts are
    token ids whatever ``options.text`` says; :class:`TokenIdsMissingError` stops the run
    (the other conversations are cancelled)."""
    extra = {**options.extra_body, **RETURN_TOKEN_IDS}
    opts = dataclasses.replace(options, text=None, extra_body=extra)
    total = sum(p.turns for p in plans)
    async with sending(
        base_url, model, total, concurrency, options=opts, progress=progress, desc=desc
    ) as sender:

        async def send(spec: RequestSpec) -> tuple[RequestRecord, Tokens | None]:
            record, state = await sender.send(spec)
            return record, None if state.token_ids is None else tuple(state.token_ids)

        try:
            async with asyncio.TaskGroup() as group:
                tasks = [
                    group.create_task(converse(p, send, sender.clock, asyncio.sleep)) for p in plans
                ]
        except* TokenIdsMissingError as failed:
            raise failed.exceptions[0] from None
    return sorted((r for t in tasks for r in t.result()), key=lambda r: r.index)

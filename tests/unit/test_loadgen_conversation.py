"""The conversation workload: plans, prompt growth by the answers' token ids, the turn
schedule with think time (on a fake clock), failed turns and answers without ids, the
per-turn summary, the flags that build it. Over HTTP: test_loadgen_conversation_client."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Callable

import pytest

from kvserve.loadgen import options as opt
from kvserve.loadgen.client import StreamState
from kvserve.loadgen.conversation import (
    ConversationPlan,
    ConversationShape,
    conversation_plans,
    conversation_summary,
    first_turns,
    grow,
    salted_plans,
    source_shares,
    with_starts,
)
from kvserve.loadgen.conversation_client import SendTurn, TokenIdsMissingError, converse
from kvserve.loadgen.metrics import RequestRecord
from kvserve.loadgen.sweep import rate_row
from kvserve.loadgen.workloads import MIN_TOKEN, Lengths, RequestSpec

VOCAB = 1000
SHAPE = ConversationShape(3, Lengths(40, 0.25), Lengths(8, 0.25), Lengths(5), 2.0, 0.5)


def test_plans_are_deterministic_and_shaped() -> None:
    plans = conversation_plans(4, seed=1, shape=SHAPE, vocab=VOCAB)
    assert plans == conversation_plans(4, seed=1, shape=SHAPE, vocab=VOCAB)
    assert plans != conversation_plans(4, seed=2, shape=SHAPE, vocab=VOCAB)
    assert [p.conversation for p in plans] == [0, 1, 2, 3]
    for p in plans:
        assert p.turns == 3 and p.answer_tokens == (5, 5, 5)
        assert 30 <= len(p.first) <= 50 and len(p.users) == 2
        assert all(6 <= len(u) <= 10 for u in p.users)
        assert len(p.think_s) == 2 and all(1.0 <= t <= 3.0 for t in p.think_s)
        assert all(MIN_TOKEN <= t < VOCAB for m in (p.first, *p.users) for t in m)
    assert len({p.first for p in plans}) == 4  # no two conversations share a first message


def test_salting_keeps_lengths_and_changes_every_message() -> None:
    plans = conversation_plans(2, seed=0, shape=SHAPE, vocab=VOCAB)
    salted = salted_plans(plans, 3, VOCAB)
    for a, b in zip(plans, salted, strict=True):
        assert len(a.first) == len(b.first) and a.first != b.first
        assert [len(u) for u in a.users] == [len(u) for u in b.users]
        assert all(x != y for x, y in zip(a.users, b.users, strict=True))
        assert (a.answer_tokens, a.think_s) == (b.answer_tokens, b.think_s)


def test_first_turns_and_starts() -> None:
    plans = with_starts(conversation_plans(3, 0, SHAPE, VOCAB), [0.0, 0.5, 2.0])
    specs = first_turns(plans)
    assert [(s.index, s.arrival_s, s.turn, s.conversation) for s in specs] == [
        (0, 0.0, 0, 0),
        (3, 0.5, 0, 1),
        (6, 2.0, 0, 2),
    ]
    assert specs[1].prompt_token_ids == plans[1].first
    with pytest.raises(ValueError, match="start times"):
        with_starts(plans, [0.0])
    with pytest.raises(ValueError, match="messages and pauses"):
        ConversationPlan(0, 0.0, (100,), (), (4, 4), ())


def test_a_prompt_grows_by_the_answer_then_the_user_message() -> None:
    assert grow((1, 2), (3,), (4, 5)) == (1, 2, 3, 4, 5)


class FakeTime:
    """A clock that only moves when the code under test sleeps or a fake request runs."""

    def __init__(self) -> None:
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds


Answer = tuple[int, ...] | None


def fake_server(
    time: FakeTime, fail_turn: int = -1, answer: Callable[[RequestSpec], Answer] | None = None
) -> tuple[list[tuple[float, tuple[int, ...]]], SendTurn]:
    """A send that takes 0.5 s, answers the ids ``(1000 + index, 2000 + index)`` (or
    ``answer(spec)``), reports 2 completion tokens and the prompt's length as its
    ``prompt_tokens``; ``fail_turn`` gets a 503."""
    sent: list[tuple[float, tuple[int, ...]]] = []

    async def send(spec: RequestSpec) -> tuple[RequestRecord, Answer]:
        start = time.now
        sent.append((start, spec.prompt_token_ids))
        time.now += 0.5
        failed = spec.turn == fail_turn
        record = RequestRecord(
            index=spec.index,
            arrival_s=spec.arrival_s,
            prompt_len=spec.prompt_len,
            max_tokens=spec.max_tokens,
            group=-1,
            start_s=start,
            end_s=time.now,
            chunk_times_s=() if failed else (start + 0.1, time.now),
            output_tokens=0 if failed else 2,
            prompt_tokens=None if failed else spec.prompt_len,
            error="HTTP 503" if failed else None,
            status_code=503 if failed else 200,
            conversation=spec.conversation,
            turn=spec.turn,
        )
        if failed:
            return record, None
        return record, answer(spec) if answer else (1000 + spec.index, 2000 + spec.index)

    return sent, send


PLAN = ConversationPlan(1, 2.0, (101, 102), ((201,), (301, 302)), (4, 4, 4), (1.0, 3.0))


def test_turns_wait_for_the_answer_plus_the_think_time() -> None:
    time = FakeTime()
    sent, send = fake_server(time)
    records = asyncio.run(converse(PLAN, send, time.clock, time.sleep))
    p0 = (101, 102)
    p1 = (*p0, 1003, 2003, 201)  # the answer's ids exactly as returned, then the message
    p2 = (*p1, 1004, 2004, 301, 302)
    # turn 0 at the start; turn 1 at 2.5 (end) + 1.0; turn 2 at 4.0 (end) + 3.0
    assert sent == [(2.0, p0), (3.5, p1), (7.0, p2)]
    assert [(r.index, r.turn, r.conversation) for r in records] == [(3, 0, 1), (4, 1, 1), (5, 2, 1)]
    assert [r.arrival_s for r in records] == [2.0, 3.5, 7.0]
    assert [r.prompt_len for r in records] == [len(p0), len(p1), len(p2)]


def test_a_failed_turn_ends_its_conversation_and_counts_the_rest_as_failed() -> None:
    time = FakeTime()
    sent, send = fake_server(time, fail_turn=1)
    records = asyncio.run(converse(PLAN, send, time.clock, time.sleep))
    assert [t for t, _ in sent] == [2.0, 3.5]
    assert [(r.turn, r.ok) for r in records] == [(0, True), (1, False), (2, False)]
    assert records[1].prompt_len == 2 + 2 + 1  # the prompt's ids, as sent
    last = records[2]
    assert last.index == 5 and last.arrival_s == last.start_s == 4.0
    assert last.error is not None and "turn 1 of conversation 1 failed" in last.error


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        (lambda spec: None, '"return_token_ids": true'),
        (lambda spec: (7,), "1 token_ids for 2 completion tokens"),
        (lambda spec: None if spec.turn == 2 else (7, 8), "turn 2 of conversation 1"),
    ],
)
def test_an_answer_without_its_ids_stops_the_conversation(
    answer: Callable[[RequestSpec], Answer], says: str
) -> None:
    time = FakeTime()
    _, send = fake_server(time, answer=answer)
    with pytest.raises(TokenIdsMissingError, match=says):
        asyncio.run(converse(PLAN, send, time.clock, time.sleep))


def test_the_stream_keeps_the_answers_token_ids() -> None:
    state = StreamState()
    choices = [{"text": "a", "token_ids": [5, 6]}, {"token_ids": []}, {"token_ids": [7]}, {}]
    for i, choice in enumerate(choices):
        assert state.feed(b"data: " + json.dumps({"choices": [choice]}).encode(), i)
    assert state.feed(b'data: {"choices":[],"usage":{"prompt_tokens":3}}', 4.0)
    assert not state.feed(b"data: [DONE]", 5.0)
    assert state.token_ids == [5, 6, 7] and state.chunks == [0.0, 1.0, 2.0, 3.0]
    none = StreamState()
    assert none.feed(b'data: {"choices":[{"text":"a"}]}', 0.0) and none.token_ids is None
    with pytest.raises(ValueError, match="token_ids"):
        StreamState().feed(b'data: {"choices":[{"token_ids":["5"]}]}', 0.0)


def turn_record(turn: int, ttft: float, prompt: int, cached: int) -> RequestRecord:
    return RequestRecord(
        turn, 0.0, prompt, 4, -1, 0.0, 1.0, (ttft, 1.0), 4, prompt, cached, turn=turn
    )


def test_the_summary_is_per_turn_and_overall() -> None:
    records = [
        turn_record(0, 0.2, 100, 0),
        turn_record(0, 0.4, 100, 0),
        turn_record(1, 0.1, 200, 150),
        turn_record(1, 0.3, 200, 50),
    ]
    server = {"prompt_tokens": {"local": 150.0, "pool": 50.0, "computed": 400.0}}
    summary = conversation_summary(records, server)
    assert list(summary["by_turn"]) == ["0", "1"]
    first, second = summary["by_turn"]["0"], summary["by_turn"]["1"]
    assert (first["ttft_p50_s"], first["ttft_p90_s"]) == pytest.approx((0.3, 0.38))
    assert first["cache_hit_rate"] == 0.0 and second["cache_hit_rate"] == 0.5
    assert second["mean_prompt_tokens"] == 200
    assert summary["overall"]["requests"] == summary["overall"]["completed"] == 4
    assert summary["overall"]["cache_hit_rate"] == pytest.approx(200 / 600)
    assert summary["prompt_sources"] == pytest.approx(
        {"local": 150 / 600, "pool": 50 / 600, "computed": 400 / 600}
    )
    assert source_shares(None) is None and source_shares({"prompt_tokens": {}}) is None


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    opt.add_arguments(parser)
    return parser.parse_args(argv)


def test_the_flags_build_the_conversation_workload() -> None:
    args = parse(["--workload", "conversation", "--conversations", "3", "--turns", "4"])
    workload = opt.build_workload(args)
    assert workload.conversations is not None and len(workload.conversations) == 3
    assert all(p.turns == 4 for p in workload.conversations)
    assert [s.turn for s in workload.specs] == [0, 0, 0]
    assert workload.conditions["conversations"] == 3 and workload.conditions["turns"] == 4
    assert opt.prompt_format(args) == "ids"
    assert (
        opt.prompt_format(parse(["--workload", "conversation", "--prompt-format", "text"])) == "ids"
    )
    assert opt.prompt_format(parse(["--workload", "mixed"])) == "ids"
    assert opt.build_workload(parse(["--workload", "mixed"])).conversations is None
    with pytest.raises(ValueError, match="--conversations"):
        opt.build_workload(parse(["--workload", "conversation", "--num-requests", "5"]))


def test_only_a_conversation_run_has_a_conversation_block() -> None:
    args = parse(["--workload", "conversation"])
    turns = [turn_record(0, 0.2, 100, 0), turn_record(1, 0.1, 200, 150)]
    row = rate_row(args, 1.0, turns, None, None)
    assert row["conversation"]["by_turn"]["1"]["cache_hit_rate"] == 0.75
    plain = [RequestRecord(0, 0.0, 100, 4, -1, 0.0, 1.0, (0.2, 1.0), 4, 100, 0)]
    assert "conversation" not in rate_row(args, 1.0, plain, None, None)

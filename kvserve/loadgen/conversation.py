"""Multi-turn conversations: their plans (built purely from a seed), how a turn's prompt grows
from the previous turn's, when a turn is sent, and the per-turn summary of a run. Pure: the
driver that sends them is :mod:`.conversation_client`.

A conversation ``c`` of ``T`` turns (request index ``c * T + t`` for turn ``t``):

- turn 0's prompt is the first message (``first`` tokens, :class:`~.workloads.Lengths`);
- turn ``t > 0``'s prompt is turn ``t - 1``'s prompt, then turn ``t - 1``'s answer as the
  server generated it (its token ids), then user message ``t`` (:func:`grow`): every prompt
  starts with the whole previous turn, its answer included, token for token, as a chat's
  does;
- turn 0 is ready at the conversation's start (the arrival process's time for the ``c``-th
  conversation); turn ``t > 0`` is ready ``think_s[t - 1]`` seconds after turn ``t - 1``'s
  answer ended (:func:`ready_s`) and is sent then (or once a concurrency slot frees up);
- each turn asks for ``answer_tokens[t]`` tokens.

Messages are token ids in ``[100, vocab)``; think times are uniform in
``think_s * [1 - spread, 1 + spread]``. Prompts are token ids throughout: nothing is ever
decoded to text or re-tokenized (the answers' ids come from the server: the driver's).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvserve.loadgen.metrics import RequestRecord, cache_hit_rate, describe, present
from kvserve.loadgen.workloads import (
    DEFAULT_VOCAB,
    Lengths,
    RequestSpec,
    random_tokens,
    salt_tokens,
)

Tokens = tuple[int, ...]
SOURCES = ("local", "pool", "computed")
"""Where a prompt token's KV came from, as the router counts them (``prompt_tokens``)."""


@dataclass(frozen=True)
class ConversationShape:
    """The lengths and pauses of every conversation of a run."""

    turns: int
    first: Lengths
    user: Lengths
    answer: Lengths
    think_s: float
    think_spread: float = 0.0

    def __post_init__(self) -> None:
        if self.turns < 1 or self.think_s < 0 or not 0.0 <= self.think_spread < 1.0:
            raise ValueError(f"conversations need turns >= 1, think_s >= 0, got {self}")


@dataclass(frozen=True)
class ConversationPlan:
    """What one conversation will say, bar the answers: its start, first message, the user
    messages of turns ``1..T-1``, each turn's ``max_tokens`` and the ``T - 1`` think times."""

    conversation: int
    start_s: float
    first: tuple[int, ...]
    users: tuple[tuple[int, ...], ...]
    answer_tokens: tuple[int, ...]
    think_s: tuple[float, ...]

    def __post_init__(self) -> None:
        turns = len(self.answer_tokens)
        if turns < 1 or len(self.users) != turns - 1 or len(self.think_s) != turns - 1:
            raise ValueError(f"a plan of {turns} turns needs {turns - 1} messages and pauses")

    @property
    def turns(self) -> int:
        return len(self.answer_tokens)

    def index(self, turn: int) -> int:
        """The request index of ``turn``: ``conversation * turns + turn``."""
        return self.conversation * self.turns + turn

    def turn_spec(self, turn: int, ready_s: float, prompt: Tokens | None = None) -> RequestSpec:
        """The request of ``turn``, ready at ``ready_s``, with ``prompt`` (:func:`grow`; the
        first message by default, which is turn 0's)."""
        return RequestSpec(
            index=self.index(turn),
            arrival_s=ready_s,
            prompt_token_ids=self.first if prompt is None else prompt,
            max_tokens=self.answer_tokens[turn],
            conversation=self.conversation,
            turn=turn,
        )


def uniform_s(rng: random.Random, mean: float, spread: float) -> float:
    """A pause uniform in ``mean * [1 - spread, 1 + spread]`` (exactly ``mean`` at 0 spread)."""
    return mean if spread == 0 else rng.uniform(mean * (1 - spread), mean * (1 + spread))


def conversation_plans(
    n: int, seed: int, shape: ConversationShape, vocab: int = DEFAULT_VOCAB
) -> list[ConversationPlan]:
    """``n`` conversations of ``shape`` (every one starting at 0: :func:`with_starts`)."""
    rng = random.Random(seed)
    plans = []
    for c in range(n):
        first = random_tokens(rng, shape.first.sample(rng), vocab)
        users = tuple(
            random_tokens(rng, shape.user.sample(rng), vocab) for _ in range(1, shape.turns)
        )
        answers = tuple(shape.answer.sample(rng) for _ in range(shape.turns))
        pauses = tuple(uniform_s(rng, shape.think_s, shape.think_spread) for _ in users)
        plans.append(ConversationPlan(c, 0.0, first, users, answers, pauses))
    return plans


def grow(prompt: Tokens, answer: Tokens, user: Tokens) -> Tokens:
    """The next turn's prompt: the previous prompt, its answer, the new user message."""
    return prompt + answer + user


def ready_s(answer_end_s: float, think_s: float) -> float:
    """When the next turn is sent: the previous answer's end plus the think time."""
    return answer_end_s + think_s


def with_starts(
    plans: Sequence[ConversationPlan], times_s: Sequence[float]
) -> list[ConversationPlan]:
    """The same conversations starting at ``times_s`` (one per conversation, in order)."""
    if len(plans) != len(times_s):
        raise ValueError(f"{len(plans)} conversations but {len(times_s)} start times")
    return [dataclasses.replace(p, start_s=t) for p, t in zip(plans, times_s, strict=True)]


def salted_plans(
    plans: Sequence[ConversationPlan], salt: int, vocab: int = DEFAULT_VOCAB
) -> list[ConversationPlan]:
    """Every message's tokens shifted as :func:`~.workloads.salted` shifts a prompt's."""
    return [
        dataclasses.replace(
            p,
            first=salt_tokens(p.first, salt, vocab),
            users=tuple(salt_tokens(u, salt, vocab) for u in p.users),
        )
        for p in plans
    ]


def first_turns(plans: Sequence[ConversationPlan]) -> list[RequestSpec]:
    """Turn 0 of each conversation as a request of its own (warm-up, SLO calibration)."""
    return [p.turn_spec(0, p.start_s) for p in plans]


def abandoned(plan: ConversationPlan, turn: int, at_s: float) -> list[RequestRecord]:
    """Failed records of turns ``turn..T-1``, which cannot be built once turn ``turn - 1``
    failed (its answer is missing): every turn of a run is counted, failures as misses."""
    error = f"not sent: turn {turn - 1} of conversation {plan.conversation} failed"
    return [
        RequestRecord(
            index=plan.index(t),
            arrival_s=at_s,
            prompt_len=0,
            max_tokens=plan.answer_tokens[t],
            group=-1,
            start_s=at_s,
            end_s=at_s,
            error=error,
            conversation=plan.conversation,
            turn=t,
        )
        for t in range(turn, plan.turns)
    ]


def turn_stats(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """Requests, completions, TTFT p50/p90 (s), mean prompt tokens and the share of prompt
    tokens the server reported cached (``usage``), over ``records``."""
    done = [r for r in records if r.ok]
    ttft = describe(present([r.ttft_s for r in done]))
    prompts = present([r.prompt_tokens for r in done])
    return {
        "requests": len(records),
        "completed": len(done),
        "ttft_p50_s": ttft.p50,
        "ttft_p90_s": ttft.p90,
        "mean_prompt_tokens": sum(prompts) / len(prompts) if prompts else None,
        "cache_hit_rate": cache_hit_rate(done),
    }


def source_shares(server: dict[str, Any] | None) -> dict[str, float] | None:
    """The share of prompt tokens from each of :data:`SOURCES`, from the router's counters
    over the run (:func:`~.counters.counters_delta`); None without them or with no token."""
    counts = (server or {}).get("prompt_tokens") or {}
    total = sum(counts.get(s, 0.0) for s in SOURCES)
    return {s: counts.get(s, 0.0) / total for s in SOURCES} if total > 0 else None


def conversation_summary(
    records: Sequence[RequestRecord], server: dict[str, Any] | None
) -> dict[str, Any]:
    """A run's turns: :func:`turn_stats` overall and per turn index (keys ``"0"``, ``"1"``,
    ...), and the prompt tokens' sources over the whole run (:func:`source_shares`; the
    router counts them per run, not per request)."""
    turns = sorted({r.turn for r in records})
    return {
        "overall": turn_stats(records),
        "by_turn": {str(t): turn_stats([r for r in records if r.turn == t]) for t in turns},
        "prompt_sources": source_shares(server),
    }

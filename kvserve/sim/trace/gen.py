"""Block-hash traces of multi-turn sessions, generated from a seed (``bench trace --traces``).
Pure.

A session is a conversation of :class:`~kvserve.loadgen.conversation.ConversationShape`
(its turns, message lengths, answer lengths and think times, as ``bench compare --workload
conversation`` sends them live), optionally opened by one of a few shared system prompts (a
tool agent's instructions and tool definitions). Sessions start by a Poisson process
(:func:`~kvserve.loadgen.arrivals.poisson_arrivals`); within one, turn ``t + 1`` is sent
``think_s`` after turn ``t``'s answer ended (:func:`~kvserve.loadgen.conversation.ready_s`),
the answer taking ``answer_s_per_token`` per output token from the moment it was sent.

Each turn's prompt is the previous prompt, the previous answer and a new message
(:func:`~kvserve.loadgen.conversation.grow`, by lengths only: no token is drawn), so the
whole session is one growing token string ``S`` (system prompt, first message, answer,
message, ...) and turn ``t``'s prompt is ``S[:n_t]``. Its trace line is in the Mooncake
form the replay reads (:class:`~kvserve.sim.trace.replay.TraceRequest`): one hash id per
512-token block, block ``i`` named by (owner, ``i``, its end ``min(512 (i + 1), n_t)``),
where the owner is the system prompt when the block ends within it, else the session. So
equal ids mean equal prefixes, exactly: a full block of a system prompt is shared by every
session opened by it, a session's full blocks by its later turns, and a partial last block
by nothing (the next turn's block there is longer).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from kvserve.loadgen.arrivals import poisson_arrivals
from kvserve.loadgen.conversation import ConversationShape, ready_s, uniform_s
from kvserve.loadgen.workloads import Lengths
from kvserve.sim.trace.replay import BLOCK_TOKENS, TraceRequest


@dataclass(frozen=True)
class SessionShape:
    """How a generated trace's sessions look.

    - ``sessions``: how many sessions the trace holds;
    - ``sessions_per_s``: the rate of the Poisson process that starts them;
    - ``conversation``: each session's turns, message and answer lengths (tokens) and think
      times (seconds);
    - ``system_prompts``: distinct shared system prompts (0: none); each session opens with
      one of them, uniformly at random;
    - ``system``: the system prompts' lengths (tokens).
    """

    sessions: int
    sessions_per_s: float
    conversation: ConversationShape
    system_prompts: int = 0
    system: Lengths = field(default_factory=lambda: Lengths(1))

    def __post_init__(self) -> None:
        if self.sessions < 1 or self.sessions_per_s <= 0 or self.system_prompts < 0:
            raise ValueError(f"a session trace needs sessions >= 1 and a positive rate: {self}")


def _talk(
    turns: int, first: Lengths, user: Lengths, answer: Lengths, think: tuple[float, float]
) -> ConversationShape:
    """A :class:`ConversationShape` written in one line: ``think`` is (mean, spread)."""
    return ConversationShape(turns, first, user, answer, think[0], think[1])


L = Lengths
SHAPES: dict[str, SessionShape] = {
    # sessions, sessions/s, (turns, first message, user messages, answers, think s), systems
    "chat": SessionShape(
        1500, 2.0, _talk(2, L(10000, 0.9), L(1000, 0.9), L(350, 0.5), (120.0, 0.9)), 1, L(512)
    ),
    "conv-short": SessionShape(
        700, 2.0, _talk(3, L(12000, 0.75), L(300, 0.5), L(300, 0.5), (60.0, 0.5))
    ),
    "conv-long": SessionShape(
        200, 0.5, _talk(16, L(6000, 0.5), L(400, 0.75), L(500, 0.5), (60.0, 0.5))
    ),
    "agent": SessionShape(
        600, 4.0, _talk(10, L(400, 0.5), L(1000, 0.9), L(120, 0.5), (1.0, 0.75)), 4, L(6000, 0.5)
    ),
}
"""The generated shapes of the trace set (:mod:`kvserve.bench.trace.traces`): ``chat``, a chat
service whose every prompt opens with the same one-block system prompt, two turns minutes
apart (as in Mooncake's published conversation trace, whose prompts all share their first
block and whose turns are a median 2 minutes apart); ``conv-short``, short chats each
opening with a long document (little reuse beyond a session's own turns); ``conv-long``,
long chats whose context grows every turn; ``agent``, tool-agent sessions: one of 4 long
shared system prompts, then many short turns (tool calls and their results) a couple of
seconds apart."""


class _BlockNames:
    """Hash ids of (owner, block index, block end): one new id per new triple."""

    def __init__(self) -> None:
        self._ids: dict[tuple[str, int, int, int], int] = {}

    def chain(self, session: int, system: int, system_len: int, length: int) -> tuple[int, ...]:
        """The ids of ``S[:length]``'s blocks (module docstring); ``system``: the system
        prompt's index (-1: none) and ``system_len`` its length."""
        ids = []
        for i in range(-(-length // BLOCK_TOKENS)):
            end = min(BLOCK_TOKENS * (i + 1), length)
            owner = ("system", system) if end <= system_len else ("session", session)
            ids.append(self._ids.setdefault((*owner, i, end), len(self._ids)))
        return tuple(ids)


def session_trace(shape: SessionShape, seed: int, answer_s_per_token: float) -> list[TraceRequest]:
    """The requests of ``shape``'s sessions (module docstring), drawn from ``seed`` alone,
    in time order (a session's turns in turn order at equal times); each carries its
    session's index (:attr:`TraceRequest.session`)."""
    rng = random.Random(seed)
    systems = [shape.system.sample(rng) for _ in range(shape.system_prompts)]
    names = _BlockNames()
    talk = shape.conversation
    out: list[TraceRequest] = []
    for session, start in enumerate(poisson_arrivals(shape.sessions, shape.sessions_per_s, seed)):
        system = rng.randrange(len(systems)) if systems else -1
        system_len = systems[system] if systems else 0
        length, at = system_len + talk.first.sample(rng), start
        for turn in range(talk.turns):
            answer = talk.answer.sample(rng)
            ids = names.chain(session, system, system_len, length)
            out.append(TraceRequest(at * 1000.0, length, answer, ids, session))
            if turn + 1 < talk.turns:
                think = uniform_s(rng, talk.think_s, talk.think_spread)
                at = ready_s(at + answer * answer_s_per_token, think)
                length += answer + talk.user.sample(rng)
    out.sort(key=lambda r: r.timestamp_ms)
    return out

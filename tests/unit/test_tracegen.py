"""Generated session traces (kvserve/sim/trace/gen.py): deterministic by seed, the turns'
times and lengths of their shape, hash ids naming exactly the shared prefixes."""

from __future__ import annotations

import pytest

from kvserve.loadgen.arrivals import poisson_arrivals
from kvserve.loadgen.conversation import ConversationShape
from kvserve.loadgen.workloads import Lengths
from kvserve.sim.trace.gen import SHAPES, SessionShape, session_trace
from kvserve.sim.trace.replay import TraceRequest

TALK = ConversationShape(
    turns=3, first=Lengths(1000), user=Lengths(100), answer=Lengths(50), think_s=2.0
)


def test_same_seed_same_trace_other_seed_other_trace() -> None:
    shape = SessionShape(
        5,
        1.0,
        ConversationShape(4, Lengths(900, 0.5), Lengths(80, 0.5), Lengths(40, 0.5), 3.0, 0.5),
    )
    assert session_trace(shape, 1, 0.03) == session_trace(shape, 1, 0.03)
    assert session_trace(shape, 1, 0.03) != session_trace(shape, 2, 0.03)


def test_turns_grow_by_answer_and_message_after_the_think_time() -> None:
    trace = session_trace(SessionShape(2, 0.5, TALK), 7, 0.03)
    starts = poisson_arrivals(2, 0.5, 7)
    for session, start in enumerate(starts):
        turns = [r for r in trace if r.session == session]
        # each turn is sent 50 tokens * 0.03 s + 2 s after the previous one was
        assert [r.timestamp_ms for r in turns] == pytest.approx(
            [1000 * start, 1000 * (start + 3.5), 1000 * (start + 7.0)]
        )
        assert [r.input_length for r in turns] == [1000, 1150, 1300]
        assert [r.output_length for r in turns] == [50, 50, 50]
    assert [r.timestamp_ms for r in trace] == sorted(r.timestamp_ms for r in trace)


def test_ids_name_equal_prefixes_only() -> None:
    trace = session_trace(SessionShape(2, 0.5, TALK), 7, 0.03)
    first, second, third = [r.hash_ids for r in trace if r.session == 0]
    other = next(r.hash_ids for r in trace if r.session == 1)
    # 1000 tokens: a full block and a 488-token one; 1150: the full one again, then a new
    # full block (512..1024) and a partial one; 1300: both full blocks, a new partial one
    assert (len(first), len(second), len(third)) == (2, 3, 3)
    assert second[0] == first[0] and second[1] != first[1]
    assert third[:2] == second[:2] and third[2] != second[2]
    assert not set(other) & set(first + second + third)  # no system prompt: nothing shared


def test_a_system_prompt_is_shared_by_its_sessions_block_for_block() -> None:
    shape = SessionShape(6, 1.0, TALK, system_prompts=2, system=Lengths(1100))
    trace = session_trace(shape, 3, 0.03)
    firsts = [r for r in trace if r.input_length == 2100]  # turn 0: system + first message
    assert len(firsts) == 6
    # 1100 system tokens: blocks 0-1 end within it (shared), block 2 ends past it (own)
    systems = {r.hash_ids[:2] for r in firsts}
    assert len(systems) == 2
    assert len({r.hash_ids[2] for r in firsts}) == 6


def test_every_trace_keeps_the_prefix_property() -> None:
    """Equal ids at a position mean equal ids at every position before it."""
    shape = SessionShape(8, 2.0, TALK, system_prompts=2, system=Lengths(1500, 0.5))
    trace = session_trace(shape, 11, 0.03)
    seen: dict[int, tuple[int, int]] = {}
    for r in trace:
        for i, block in enumerate(r.hash_ids):
            parent = r.hash_ids[i - 1] if i else -1
            assert seen.setdefault(block, (i, parent)) == (i, parent)


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_named_shapes_give_every_turn_of_every_session(name: str) -> None:
    shape = SHAPES[name]
    trace = session_trace(shape, 0, 0.03)
    assert len(trace) == shape.sessions * shape.conversation.turns
    assert all(isinstance(r, TraceRequest) for r in trace)
    assert {r.session for r in trace} == set(range(shape.sessions))


def test_shapes_are_checked() -> None:
    with pytest.raises(ValueError, match="sessions >= 1"):
        SessionShape(0, 1.0, TALK)
    with pytest.raises(ValueError, match="positive rate"):
        SessionShape(1, 0.0, TALK)

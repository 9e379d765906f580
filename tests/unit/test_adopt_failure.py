"""A take-over that fails leaves its reservation CANCELLED, never ADOPTED (issue 18).

``Reservations.adopt`` marks a record ADOPTED only once the whole take-over succeeded,
the caller's own bookkeeping (``on_adopted``: the engine tracking the request) included.
If any of it raises, the record ends CANCELLED, its pages are back and nothing of the
request stays tracked.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvpool.hashing import Namespace, PrefixHasher
from kvpool.stream import Transfer
from workers.config import EngineConfig
from workers.core.scheduler import Scheduler, SchedulerConfig
from workers.core.sequence import FinishReason, SamplingParams, Sequence
from workers.engine.engine import Engine
from workers.handoff.reservation import HandoffState
from workers.handoff.reservations import Reservations

HASHER = PrefixHasher(Namespace(model="af@0", dtype="float32", block_tokens=4), b"key")
PROMPT = [1, 2, 3, 4, 5, 6, 7]


class BookkeepingError(RuntimeError):
    pass


def test_a_take_over_whose_bookkeeping_raises_is_cancelled() -> None:
    config = SchedulerConfig(num_blocks=8, block_tokens=4, max_model_len=32)
    sched = Scheduler(config, HASHER)
    res = Reservations(sched, None, streaming=False)
    seq = res.reserve("r", PROMPT, 4, 30.0)
    assert seq is not None
    record = res._held["r"]

    def on_adopted(adopted: Sequence, _: Transfer) -> None:
        assert adopted is seq and record.state is HandoffState.LANDED  # not ADOPTED yet
        raise BookkeepingError

    with pytest.raises(BookkeepingError):
        res.adopt("r", PROMPT, 9, SamplingParams(max_tokens=4), on_adopted=on_adopted)
    assert record.state is HandoffState.CANCELLED
    assert "r" not in res
    assert seq.is_finished and seq.finish_reason is FinishReason.ABORT
    assert sched.blocks.num_free == config.num_blocks and not sched.has_work
    res.close()


def test_a_successful_take_over_is_adopted_after_its_bookkeeping() -> None:
    sched = Scheduler(SchedulerConfig(num_blocks=8, block_tokens=4, max_model_len=32), HASHER)
    res = Reservations(sched, None, streaming=False)
    assert res.reserve("r", PROMPT, 4, 30.0) is not None
    record = res._held["r"]
    seen: list[HandoffState] = []
    adopted = res.adopt(
        "r", PROMPT, 9, SamplingParams(max_tokens=4), lambda s, t: seen.append(record.state)
    )
    assert adopted is not None and seen == [HandoffState.LANDED]
    assert record.state is HandoffState.ADOPTED and sched.running == [adopted[0]]
    res.close()


def test_the_engine_cancels_a_reservation_whose_take_over_fails(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine's own bookkeeping (here: releasing the first token's text) raises after
    the scheduler took the request: the record is CANCELLED, not ADOPTED, and the engine
    holds nothing of it."""
    engine = Engine(EngineConfig(model=str(tiny_model_dir), block_tokens=16, kv_cache_mib=4))
    try:
        assert engine.reserve("r", PROMPT, 4, 30.0) is not None
        record = engine.reservations._held["r"]

        def broken(request_id: str, token_ids: list[int]) -> None:
            raise BookkeepingError

        monkeypatch.setattr(engine.book, "released", broken)
        with pytest.raises(BookkeepingError):
            engine.adopt("r", PROMPT, 9, SamplingParams(max_tokens=4))
        assert record.state is HandoffState.CANCELLED
        assert record.seq.finish_reason is FinishReason.ABORT
        assert not engine.busy and engine._requests == {}
        assert engine.num_free_blocks == engine.num_blocks
        monkeypatch.undo()  # the id is free again: a new reservation and take-over work
        assert engine.reserve("r", PROMPT, 4, 30.0) is not None
        engine.adopt("r", PROMPT, 9, SamplingParams(max_tokens=4))
        assert engine.reservations._held == {} and list(engine._requests) == ["r"]
    finally:
        engine.close()

"""How ``Generate`` starts a request on the engine (``WorkerServicer._generate_start``):
after a remote prefill it crosses to the engine thread once before the adoption
(``Engine.arrived``), waits for what arrived off that thread (``Arrival.wait``), and adopts
with the verdict; the engine here is a recorder standing in for the engine thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any, cast

from proto import worker_pb2 as pb
from workers.core.sequence import SamplingParams
from workers.engine.loop import EngineLoop
from workers.handoff.arrival import Arrival
from workers.handoff.push_receive import PushCheck
from workers.serve.servicer import WorkerServicer


class Check:
    """A push check that records the metas it ran over and the thread it ran on."""

    def __init__(self) -> None:
        self.ran: list[tuple[list[bytes], str]] = []

    def run(self, metas: Sequence[bytes]) -> str:
        self.ran.append((list(metas), threading.current_thread().name))
        return "verdict"


class Engine:
    """Records each call the servicer makes on the engine."""

    def __init__(self, arrival: Arrival) -> None:
        self.arrival = arrival
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def arrived(self, request_id: str, pushed: bool) -> Arrival:
        self.calls.append(("arrived", (request_id, pushed)))
        return self.arrival

    def adopt(self, *args: Any) -> str:
        self.calls.append(("adopt", args))
        return "adopted"


class Loop:
    """Runs each call at once, on the caller's thread, counting them."""

    info = SimpleNamespace(max_model_len=64, pool_attached=True)

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.crossings = 0

    def call(self, fn: Callable[[Engine], Any]) -> Future[Any]:
        self.crossings += 1
        future: Future[Any] = Future()
        future.set_result(fn(self.engine))
        return future


def start(engine: Engine, request: pb.GenerateRequest) -> tuple[Loop, Callable[[Any], Any]]:
    loop = Loop(engine)
    servicer = WorkerServicer(cast(EngineLoop, loop), "decode", lambda: None)
    starter = asyncio.run(servicer._generate_start(request, SamplingParams(max_tokens=4)))
    return loop, starter


def test_an_adoption_after_a_push_crosses_to_the_engine_once_and_checks_off_it() -> None:
    check = Check()
    engine = Engine(Arrival(check=cast(PushCheck, check)))
    request = pb.GenerateRequest(
        request_id="r1", prompt_token_ids=[1, 2, 3], first_token=7, pushed_metas=[b"m0", b"m1"]
    )
    loop, starter = start(engine, request)
    assert loop.crossings == 1
    assert engine.calls == [("arrived", ("r1", True))]
    assert check.ran == [([b"m0", b"m1"], check.ran[0][1])]
    assert check.ran[0][1] != threading.main_thread().name  # off the caller's thread
    assert starter(engine) == "adopted"
    name, args = engine.calls[-1]
    assert name == "adopt" and args[0] == "r1" and args[2] == 7 and args[-1] == "verdict"


def test_an_adoption_with_nothing_to_wait_for_adopts_without_a_verdict() -> None:
    engine = Engine(Arrival())
    request = pb.GenerateRequest(request_id="r2", prompt_token_ids=[1, 2], first_token=5)
    loop, starter = start(engine, request)
    assert loop.crossings == 1
    assert engine.calls == [("arrived", ("r2", False))]
    starter(engine)
    assert engine.calls[-1][1][-1] is None


def test_a_new_request_does_not_cross_before_it_is_added() -> None:
    engine = Engine(Arrival())
    loop, _ = start(engine, pb.GenerateRequest(request_id="r3", prompt_token_ids=[1]))
    assert loop.crossings == 0 and engine.calls == []

"""A restarted worker is asked again at once (router.placement.candidates, router.flow.run): a call
that failed UNAVAILABLE on a worker the router's view has not yet seen restarted goes to its
new process instead of ending in a 503, and a worker is renewed at most once per request;
a decode worker whose Generate failed before its first chunk is asked once more after the
others."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any, cast

import grpc
import pytest

from proto import worker_pb2 as pb
from proto.registry import WorkerRecord
from router.errors import APIError
from router.flow.plan import FlowPlan
from router.flow.run import RequestFlow
from router.flow.types import Chunk, FlowResult
from router.placement.live_worker import LiveWorker

RECORD = WorkerRecord(
    worker_id="d1", address="127.0.0.1:1", role="decode", model="m", model_dir="/nowhere",
    contract="m|L2", block_tokens=4, num_layers=2, max_model_len=4096, started_at=1.0,
    heartbeat_at=1.0,
)  # fmt: skip
PROMPT = [1, 2, 3, 4, 5]


def rpc_error(code: grpc.StatusCode) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), "stub", "")


class Stub:
    """A worker's RPCs: each method fails with ``fails`` (when set) or answers."""

    def __init__(self, fails: grpc.StatusCode | None = None) -> None:
        self.fails = fails
        self.calls: list[str] = []

    def _call(self, method: str) -> None:
        self.calls.append(method)
        if self.fails is not None:
            raise rpc_error(self.fails)

    async def Reserve(self, request: pb.ReserveRequest, timeout: float) -> pb.ReserveReply:
        self._call("Reserve")
        return pb.ReserveReply(ok=True)

    def Prefill(self, request: pb.PrefillRequest, timeout: float) -> Any:
        stub = self

        class Call:
            async def read(self) -> pb.PrefillReply:
                stub._call("Prefill")
                return pb.PrefillReply(
                    first_token=7, text=" x", finish_reason=pb.FINISH_REASON_LENGTH
                )  # finished: the flow reads no more

            def cancel(self) -> None:
                pass

        return Call()

    def Generate(self, request: pb.GenerateRequest, timeout: float) -> Any:
        chunks = self.generated(request)

        class Call:
            def __aiter__(self) -> AsyncIterator[pb.TokenChunk]:
                return chunks

            def cancel(self) -> None:
                pass

        return Call()

    async def generated(self, request: pb.GenerateRequest) -> AsyncIterator[pb.TokenChunk]:
        """The chunks of one ``Generate`` call, as it is iterated."""
        self._call("Generate")
        yield pb.TokenChunk(token_ids=[9], text=" y", finish_reason=pb.FINISH_REASON_LENGTH)

    async def Abort(self, request: pb.AbortRequest, timeout: float) -> pb.AbortReply:
        self.calls.append("Abort")
        return pb.AbortReply()


class Observer:
    def __init__(self) -> None:
        self.results: list[FlowResult] = []

    def __getattr__(self, name: str) -> Any:
        return lambda *args: None

    def on_finish(self, result: FlowResult) -> None:
        self.results.append(result)


def worker(worker_id: str, stub: Stub, started_at: float = 1.0) -> LiveWorker:
    record = dataclasses.replace(RECORD, worker_id=worker_id, started_at=started_at)
    return LiveWorker(record, cast(Any, stub))


class View:
    """``WorkerView.renewed`` over a fixed table of successors (worker id -> LiveWorker)."""

    def __init__(self, successors: dict[str, LiveWorker]) -> None:
        self.successors = successors
        self.asked: list[str] = []

    async def renewed(self, old: LiveWorker) -> LiveWorker | None:
        self.asked.append(old.worker_id)
        return self.successors.get(old.worker_id)


def run(
    prefill: LiveWorker | None,
    decode: Sequence[LiveWorker],
    view: View,
    observer: Observer | None = None,
) -> list[Chunk]:
    plan = FlowPlan(
        request_id="r1", prompt_token_ids=PROMPT, params=pb.SamplingParams(max_tokens=1),
        prefill=prefill, decode=tuple(decode), lease_ms=1000, timeout_s=10.0,
        started_at=time.monotonic(),
    )  # fmt: skip
    flow = RequestFlow(plan, cast(Any, observer or Observer()), renew=view.renewed)

    async def collect() -> list[Chunk]:
        return [chunk async for chunk in flow.chunks()]

    return asyncio.run(collect())


UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


def test_a_reservation_goes_to_the_restarted_process() -> None:
    dead1, dead2, fresh = Stub(UNAVAILABLE), Stub(UNAVAILABLE), Stub()
    view = View({"d1": worker("d1", fresh, started_at=2.0)})
    chunks = run(worker("p1", Stub()), [worker("d1", dead1), worker("d2", dead2)], view)
    assert [c.text for c in chunks] == [" x"]
    assert dead1.calls == ["Reserve"]  # its successor took its place, the abort too
    assert fresh.calls == ["Reserve", "Abort"]  # held pages, freed: the first token finished
    assert dead2.calls == []  # the successor took it: the next candidate was not needed
    assert view.asked == ["d1"]


def test_without_a_successor_every_candidate_is_asked_once_then_503() -> None:
    view = View({})
    stubs = [Stub(UNAVAILABLE), Stub(UNAVAILABLE)]
    with pytest.raises(APIError) as failed:
        run(worker("p1", Stub()), [worker("d1", stubs[0]), worker("d2", stubs[1])], view)
    assert failed.value.status == 503
    assert "d1: UNAVAILABLE; d2: UNAVAILABLE" in failed.value.message
    assert view.asked == ["d1", "d2"]
    assert [s.calls.count("Reserve") for s in stubs] == [1, 1]


def test_a_worker_is_renewed_once_per_request() -> None:
    dead, also_dead = Stub(UNAVAILABLE), Stub(UNAVAILABLE)
    view = View({"d1": worker("d1", also_dead, started_at=2.0)})
    with pytest.raises(APIError) as failed:
        run(worker("p1", Stub()), [worker("d1", dead)], view)
    assert failed.value.status == 503
    assert view.asked == ["d1"]
    assert (dead.calls.count("Reserve"), also_dead.calls.count("Reserve")) == (1, 1)


def test_only_unavailable_is_looked_up_again() -> None:
    view = View({"d1": worker("d1", Stub(), started_at=2.0)})
    refusing = Stub(grpc.StatusCode.FAILED_PRECONDITION)  # draining: not a restart
    with pytest.raises(APIError):
        run(worker("p1", Stub()), [worker("d1", refusing)], view)
    assert view.asked == []


def test_a_local_generate_goes_to_the_restarted_process() -> None:
    dead, fresh = Stub(UNAVAILABLE), Stub()
    view = View({"m1": worker("m1", fresh, started_at=2.0)})
    chunks = run(None, [worker("m1", dead)], view)
    assert [(c.text, c.finish_reason) for c in chunks] == [(" y", "length")]
    assert dead.calls[0] == "Generate" and fresh.calls[0] == "Generate"
    assert view.asked == ["m1"]


class Scripted(Stub):
    """A decode worker whose ``Generate`` calls go by ``script``, one entry per call: None
    streams one chunk and finishes; a code fails before any chunk; ``("after", code)``
    streams one unfinished chunk, then fails. Every request it gets is kept."""

    def __init__(self, *script: Any) -> None:
        super().__init__()
        self.script = list(script)
        self.requests: list[pb.GenerateRequest] = []

    async def generated(self, request: pb.GenerateRequest) -> AsyncIterator[pb.TokenChunk]:
        self.requests.append(request)
        step = self.script.pop(0)
        self.calls.append("Generate")
        if isinstance(step, tuple):
            yield pb.TokenChunk(token_ids=[8], text=" z")
            raise rpc_error(step[1])
        if step is not None:
            raise rpc_error(step)
        yield pb.TokenChunk(token_ids=[9], text=" y", finish_reason=pb.FINISH_REASON_LENGTH)


def test_a_worker_that_refused_is_asked_once_more_after_the_others() -> None:
    """d1 refuses (its channel was still redialing), d2 fails after a chunk: the request
    resumes on d1 after that chunk instead of failing."""
    d1, d2 = Scripted(UNAVAILABLE, None), Scripted(("after", UNAVAILABLE))
    chunks = run(None, [worker("d1", d1), worker("d2", d2)], View({}))
    assert [(c.text, c.finish_reason) for c in chunks] == [(" z", None), (" y", "length")]
    assert d1.calls == ["Generate", "Abort", "Generate"] and d2.calls == ["Generate", "Abort"]
    assert list(d1.requests[1].resume_token_ids) == [8]


def test_a_worker_is_asked_again_once_and_not_after_it_took_the_request() -> None:
    refuses = Scripted(UNAVAILABLE, UNAVAILABLE, None)
    with pytest.raises(APIError) as failed:
        run(None, [worker("d1", refuses)], View({}))
    assert failed.value.status == 503
    assert refuses.calls.count("Generate") == 2
    d1, d2 = Scripted(("after", UNAVAILABLE), None), Scripted(UNAVAILABLE, UNAVAILABLE, None)
    observer = Observer()
    with pytest.raises(APIError):
        run(None, [worker("d1", d1), worker("d2", d2)], View({}), observer)
    assert (d1.calls.count("Generate"), d2.calls.count("Generate")) == (1, 2)
    assert observer.results[0].migrations == 1  # d1 -> d2; d2 asked once more is no move


class Pushing(Stub):
    """A prefill worker whose first token does not finish the request and whose push
    succeeded (its second message names the pushed metas)."""

    def Prefill(self, request: pb.PrefillRequest, timeout: float) -> Any:
        replies = [
            pb.PrefillReply(first_token=7, text=" x"),
            pb.PrefillReply(push=pb.PushResult(ok=True, metas=[b"meta"])),
        ]

        class Call:
            async def read(self) -> Any:
                return replies.pop(0) if replies else None  # the end: no PrefillReply

            def cancel(self) -> None:
                pass

        return Call()


def test_the_pushed_metas_go_with_the_first_call_to_their_worker_only() -> None:
    d1, d2 = Scripted(UNAVAILABLE, None), Scripted(UNAVAILABLE)
    chunks = run(worker("p1", Pushing()), [worker("d1", d1), worker("d2", d2)], View({}))
    assert [c.text for c in chunks] == [" x", " y"]
    assert [list(r.pushed_metas) for r in d1.requests] == [[b"meta"], []]
    assert [r.first_token for r in d1.requests + d2.requests] == [7, 7, 7]
    assert list(d2.requests[0].pushed_metas) == []

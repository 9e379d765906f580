"""Stub workers and a router harness for the router's integration tests.

The stub workers are real ``grpc.aio`` servers and deterministic: output token ``i`` of a
prompt ``p`` is ``p[i % len(p)] + 1`` and its text is ``" t<id>"``; asked for logprobs,
they answer each token's in the shape a worker must (:func:`stub_logprob`). They record every call
(method, request id); the verbs in ``refusing`` answer UNAVAILABLE, as a draining worker's;
``refuse`` and ``too_big`` make ``Reserve`` answer "no free pages now" and "can never fit".
:class:`Harness` runs them and the router (uvicorn) on one event loop in a thread,
registered in a real Redis (beating every ``heartbeat_s``, as workers do); everything
binds 127.0.0.1 only. A stub's ``load`` fields join its registered load report (e.g.
``prefill_tokens_per_s``); the harness's ``router_options`` override its
:class:`RouterConfig` (``api_key``: then :meth:`client` and :meth:`get` send the first key
unless told otherwise); the stubs register ``max_model_len``; the stubs beat every
``heartbeat_s``; the harness is entered once the router serves and, unless
``tokenizer_first`` is False, has its tokenizer loaded. A harness that fails to start stops
what it started.
"""

from __future__ import annotations

import asyncio
import dataclasses
import http.client
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import grpc
import openai
import redis
import uvicorn
from fastapi import FastAPI
from typing_extensions import override

from kvpool.config import PoolConfig
from kvpool.hashing import Namespace
from kvpool.net import free_local_ports
from kvserve.cluster.redis import RedisConfig, RedisProcess
from proto import worker_pb2 as pb
from proto.registry import ClusterConfig, WorkerRecord, publish
from proto.worker_pb2_grpc import WorkerServicer, add_WorkerServicer_to_server
from router.api.app import create_app
from router.config import RouterConfig

MODEL = "smol-test"
LENGTH = pb.FINISH_REASON_LENGTH
UNFINISHED = pb.FINISH_REASON_UNSPECIFIED


def out_token(prompt: list[int], i: int) -> int:
    return prompt[i % len(prompt)] + 1


def expected_text(prompt: list[int], n: int) -> str:
    return "".join(f" t{out_token(prompt, i)}" for i in range(n))


def prompt_usage(n: int) -> pb.PromptUsage:
    local, pool = min(1, n - 1), (n - 1) // 2
    return pb.PromptUsage(
        prompt_tokens=n, local_tokens=local, pool_tokens=pool, computed_tokens=n - local - pool
    )


def stub_logprob(
    token: int, params: pb.SamplingParams, field: Literal["logprobs", "prompt_logprobs"]
) -> list[pb.TokenLogprob]:
    """``token``'s logprob entry when ``params`` ask for ``field`` (``logprobs`` or
    ``prompt_logprobs``), else none: -1 for the token, and as many alternatives as asked
    (the token first, then the ids after it, each 1 lower)."""
    if not params.HasField(field):
        return []
    top = [token + k for k in range(getattr(params, field))]
    return [pb.TokenLogprob(logprob=-1.0, top_ids=top, top_logprobs=[-1.0 - k for k in top])]


STUB_CONTRACT = f"{Namespace(model=MODEL, dtype='float32', block_tokens=16).key}|stub-wire"
"""A well-formed contract (the router parses its namespace for pool lookups)."""


class StubWorker(WorkerServicer):
    def __init__(
        self,
        worker_id: str,
        role: str,
        free_pages: int = 100,
        load: Mapping[str, object] | None = None,
    ) -> None:
        self.worker_id, self.role, self.free_pages = worker_id, role, free_pages
        self.load = dict(load or {})
        self.delay_s = 0.0
        self.refuse = False
        """Reserve answers "not now" (no free pages)."""
        self.too_big = False
        """Reserve fails with INVALID_ARGUMENT: the request can never fit this worker."""
        self.refusing: set[str] = set()
        self.calls: list[tuple[str, str]] = []
        self.first_tokens: dict[str, int] = {}
        self.fail_after: int | None = None
        """Generate fails (UNAVAILABLE, like a dead worker) after this many chunks."""
        self.resumed: dict[str, list[int]] = {}

    def called(self, method: str) -> list[str]:
        return [rid for m, rid in self.calls if m == method]

    def work_calls(self) -> int:
        """Calls that place or run work (Reserve, Prefill, Generate)."""
        return sum(m in ("Reserve", "Prefill", "Generate") for m, _ in self.calls)

    async def _admit(self, verb: str, request_id: str, context: Any) -> None:
        self.calls.append((verb, request_id))
        if verb in self.refusing:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "worker is draining")

    @override
    async def Reserve(self, request: pb.ReserveRequest, context: Any) -> pb.ReserveReply:
        await self._admit("Reserve", request.request_id, context)
        if self.too_big:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "request needs 99 KV pages but the cache has 10"
            )
        return pb.ReserveReply(ok=not self.refuse, reason="full" if self.refuse else "")

    @override
    async def Prefill(
        self, request: pb.PrefillRequest, context: Any
    ) -> AsyncIterator[pb.PrefillReply]:
        await self._admit("Prefill", request.request_id, context)
        prompt = list(request.prompt_token_ids)
        first = out_token(prompt, 0)
        reply = pb.PrefillReply(
            first_token=first,
            text=f" t{first}",
            finish_reason=LENGTH if request.params.max_tokens == 1 else UNFINISHED,
            usage=prompt_usage(len(prompt)),
            transfer=pb.Transfer(bytes=1000, seconds=0.5),
        )
        for logprob in stub_logprob(first, request.params, "logprobs"):
            reply.logprob.CopyFrom(logprob)
        yield reply

    @override
    async def Generate(
        self, request: pb.GenerateRequest, context: Any
    ) -> AsyncIterator[pb.TokenChunk]:
        await self._admit("Generate", request.request_id, context)
        prompt, n = list(request.prompt_token_ids), request.params.max_tokens
        remote = request.HasField("first_token")
        if remote:
            self.first_tokens[request.request_id] = request.first_token
        resume = list(request.resume_token_ids)
        if resume:
            self.resumed[request.request_id] = resume
        start = len(resume) or (1 if remote else 0)
        for i in range(start, n):
            if self.fail_after is not None and i - start == self.fail_after:
                await context.abort(grpc.StatusCode.UNAVAILABLE, "connection reset")
            await asyncio.sleep(self.delay_s)
            tok = out_token(prompt, i)
            chunk = pb.TokenChunk(token_ids=[tok], text=f" t{tok}")
            chunk.logprobs.extend(stub_logprob(tok, request.params, "logprobs"))
            if i == n - 1:
                chunk.finish_reason = LENGTH
            if i == start:
                chunk.usage.CopyFrom(prompt_usage(len(prompt)))
                if not (remote or resume):
                    for t in prompt[1:]:
                        chunk.prompt_logprobs.extend(
                            stub_logprob(t, request.params, "prompt_logprobs")
                        )
                if remote:
                    chunk.transfer.CopyFrom(pb.Transfer(bytes=700, seconds=0.25))
            yield chunk

    @override
    async def Abort(self, request: pb.AbortRequest, context: Any) -> pb.AbortReply:
        self.calls.append(("Abort", request.request_id))
        return pb.AbortReply(found=True)

    @override
    async def GetLoad(self, request: pb.LoadRequest, context: Any) -> pb.LoadReport:
        return pb.LoadReport(role=self.role)

    @override
    async def SetRole(self, request: pb.SetRoleRequest, context: Any) -> pb.SetRoleReply:
        return pb.SetRoleReply(role=self.role, previous=self.role)


class Harness:
    """Stub workers (gRPC) and the router (uvicorn) on one event loop in a thread."""

    def __init__(
        self,
        redis_url: str,
        model_dir: Path,
        stubs: list[StubWorker],
        router_options: Mapping[str, Any] | None = None,
        max_model_len: int = 2048,
        heartbeat_s: float = ClusterConfig.heartbeat_s,
        tokenizer_first: bool = True,
    ) -> None:
        self.max_model_len, self.tokenizer_first = max_model_len, tokenizer_first
        # a liveness window well past the beat: on a loaded machine (the suite runs several
        # processes on 2 cores) this loop's beat can come seconds late, and a stub must not
        # drop out of routing for that
        self.cluster = ClusterConfig(
            redis_url=redis_url,
            cluster=f"rt{uuid.uuid4().hex[:8]}",
            heartbeat_s=heartbeat_s,
            heartbeat_ttl_s=max(15.0, 3 * heartbeat_s),
        )
        self.model_dir, self.stubs = model_dir, {s.worker_id: s for s in stubs}
        (self.port,) = free_local_ports(1)
        options = {"disagg_threshold_tokens": 4, "pool_lookup": False,
                   "tokenizer_dir": str(model_dir), **(router_options or {})}  # fmt: skip
        self.config = RouterConfig(router_port=self.port, **options)
        first = self.config.api_key.split(",")[0].strip()
        _, named, key = first.partition("=")
        self.api_key = (key if named else first) or None
        self.app: FastAPI | None = None
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.servers: list[grpc.aio.Server] = []
        self.web: uvicorn.Server | None = None
        self.web_task: asyncio.Task[None] | None = None
        self.beat_task: asyncio.Task[None] | None = None
        self.registry = redis.Redis.from_url(self.cluster.redis_url)
        """Where the stubs' records are published and renewed (one client for every beat)."""

    def __enter__(self) -> Harness:
        self.thread.start()
        started = asyncio.run_coroutine_threadsafe(self._start(), self.loop)
        try:
            started.result(30)
        except BaseException:  # nothing left running for the next test
            started.cancel()
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    async def _start(self) -> None:
        records = []
        for stub in self.stubs.values():
            server = grpc.aio.server()
            add_WorkerServicer_to_server(stub, server)
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            self.servers.append(server)
            records.append(self._record(stub, port))
        self._publish(records)
        self.beat_task = asyncio.create_task(self._beat(records))
        self.app = create_app(self.config, self.cluster, PoolConfig())
        self.web = uvicorn.Server(
            uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning")
        )
        self.web_task = asyncio.create_task(self.web.serve())
        while not self.web.started:
            await asyncio.sleep(0.02)
        if self.tokenizer_first and self.config.tokenizer_dir:
            # the router's preload, awaited: a first request's deadline would include it
            # (seconds on a loaded machine; a 1 s one ran out in it)
            await self.app.state.service.tokenizers.get(lambda: Path(self.config.tokenizer_dir))

    def _publish(self, records: list[WorkerRecord]) -> None:
        now, ttl_s = time.time(), max(120.0, self.cluster.heartbeat_ttl_s)
        for record in records:
            fresh = dataclasses.replace(record, heartbeat_at=now)
            publish(self.registry, self.cluster.keys, fresh, ttl_s=ttl_s)

    async def _beat(self, records: list[WorkerRecord]) -> None:
        """The stubs' heartbeats: their records again with a new ``heartbeat_at`` every
        ``heartbeat_s``, as a worker's (the router refuses older ones)."""
        while True:
            await asyncio.sleep(self.cluster.heartbeat_s)
            await asyncio.to_thread(self._publish, records)

    async def _stop(self) -> None:
        if self.beat_task is not None:
            self.beat_task.cancel()
        if self.web is not None and self.web_task is not None:
            self.web.should_exit = True
            await self.web_task
        for server in self.servers:
            await server.stop(None)
        self.registry.close()

    def _record(self, stub: StubWorker, port: int) -> WorkerRecord:
        now = time.time()
        return WorkerRecord(
            worker_id=stub.worker_id, address=f"127.0.0.1:{port}", role=stub.role, model=MODEL,
            model_dir=str(self.model_dir), contract=STUB_CONTRACT, block_tokens=16,
            num_layers=2, max_model_len=self.max_model_len, started_at=now, heartbeat_at=now,
            load={"role": stub.role, "free_pages": stub.free_pages, "total_pages": 200,
                  "queued_prefill_tokens": str(stub.free_pages // 10),  # uint64: text
                  **self._speed(stub), **stub.load},
        )  # fmt: skip

    @staticmethod
    def _speed(stub: StubWorker) -> dict[str, float]:
        """A prefill stub's prefill speed: a stub computes at once, so the work its reports
        keep pending (they are never renewed) does not make it look backed up, and a prompt
        over the threshold goes to it (:func:`router.placement.types.prefill_locally`)."""
        return {"prefill_tokens_per_s": 1e9} if stub.role == "prefill" else {}

    def client(self, api_key: str | None = None) -> openai.OpenAI:
        base = f"http://127.0.0.1:{self.port}/v1"
        key = api_key or self.api_key or "none"
        return openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=20)

    def get(
        self, path: str, body: bytes | None = None, headers: Mapping[str, str] | None = None
    ) -> tuple[int, bytes]:
        """GET ``path`` (POST with ``body``); ``headers`` replace the default ones."""
        status, _, data = self.request(path, body, headers)
        return status, data

    def request(
        self, path: str, body: bytes | None = None, headers: Mapping[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        """Status, headers and body of GET ``path`` (POST with ``body``)."""
        if headers is None:
            headers = {"Content-Type": "application/json"}
            if self.api_key:
                headers["Authorization"] = f"Bearer {self.api_key}"
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("GET" if body is None else "POST", path, body=body, headers=headers)
            resp = conn.getresponse()
            return resp.status, dict(resp.getheaders()), resp.read()
        finally:
            conn.close()


@contextmanager
def running_redis(log_dir: Path) -> Iterator[str]:
    """A real Redis on a free 127.0.0.1 port (its URL), stopped on exit."""
    (port,) = free_local_ports(1)
    with RedisProcess(RedisConfig(port=port), log_dir / "redis.log") as server:
        yield server.url


def wait_for(predicate: Any, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return bool(predicate())

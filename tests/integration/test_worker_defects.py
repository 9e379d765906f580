"""The worker's gRPC entrance keeps one request's trouble to itself (issue 16): a duplicate
request id, a first token outside the vocabulary, a request the engine fails on, a take-over
or a landing that raises, and role changes that come together. A real servicer over a real
engine (tests/integration/worker_harness.py); each test ends with every page free."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch

import workers.handoff.reservations as reservations_module
from kvpool.landing import Lander
from proto import worker_pb2 as pb
from tests.integration.test_exactness import random_prompts
from tests.integration.worker_harness import ServedWorker, serving_worker
from workers.config import EngineConfig
from workers.core.sampling import sample as real_sample
from workers.core.sequence import SamplingParams
from workers.engine.engine import Engine
from workers.handoff.reservations import Reservations

POISON_SEED = 4242
CALL_S = 60.0


@pytest.fixture(scope="module")
def config(tiny_model_dir: Path) -> EngineConfig:
    return EngineConfig(model=str(tiny_model_dir), block_tokens=16, kv_cache_mib=16, threads=1)


@pytest.fixture
def worker(config: EngineConfig) -> Iterator[ServedWorker]:
    with serving_worker(config) as served:
        yield served
        assert served.idle()


def params(max_tokens: int, seed: int | None = None) -> pb.SamplingParams:
    msg = pb.SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    if seed is not None:
        msg.temperature, msg.seed = 0.8, seed
    return msg


def generate(worker: ServedWorker, rid: str, prompt: list[int], p: pb.SamplingParams) -> Any:
    request = pb.GenerateRequest(request_id=rid, prompt_token_ids=prompt, params=p)
    return worker.stub.Generate(request, timeout=CALL_S)


def tokens_of(stream: Any) -> list[int]:
    return [t for chunk in stream for t in chunk.token_ids]


def test_a_duplicate_request_id_is_refused_without_harming_the_first(
    worker: ServedWorker,
) -> None:
    (prompt,) = random_prompts((20,), seed=1)
    first = generate(worker, "dup", prompt, params(48))
    head = next(first).token_ids
    with pytest.raises(grpc.RpcError) as refused:
        tokens_of(generate(worker, "dup", prompt, params(48)))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "already in use" in (refused.value.details() or "")
    got = [*head, *tokens_of(first)]
    assert got == tokens_of(generate(worker, "again", prompt, params(48)))


def test_an_abort_ends_the_open_call_of_its_request(worker: ServedWorker) -> None:
    """An ``Abort`` for a request whose ``Generate`` is still open ends that stream (ABORTED)
    instead of leaving it waiting for outputs that never come (found by the fuzz test)."""
    (prompt,) = random_prompts((20,), seed=9)
    stream = generate(worker, "live", prompt, params(1000))
    next(stream)
    assert worker.stub.Abort(pb.AbortRequest(request_id="live"), timeout=CALL_S).found
    with pytest.raises(grpc.RpcError) as ended:
        tokens_of(stream)
    assert ended.value.code() == grpc.StatusCode.ABORTED


def test_a_first_token_outside_the_vocabulary_is_refused(worker: ServedWorker) -> None:
    (prompt,) = random_prompts((20,), seed=2)
    reserve = pb.ReserveRequest(request_id="r1", prompt_token_ids=prompt, max_tokens=8)
    assert worker.stub.Reserve(reserve, timeout=CALL_S).ok
    request = pb.GenerateRequest(
        request_id="r1", prompt_token_ids=prompt, params=params(8), first_token=10**6
    )
    with pytest.raises(grpc.RpcError) as refused:
        tokens_of(worker.stub.Generate(request, timeout=CALL_S))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "first_token" in (refused.value.details() or "")
    assert worker.stub.Abort(pb.AbortRequest(request_id="r1"), timeout=CALL_S).found


def test_a_request_the_engine_fails_on_fails_alone(
    worker: ServedWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    def poisoned(logits: torch.Tensor, p: Any, generators: Any) -> list[int]:
        if any(x.seed == POISON_SEED for x in p):
            raise RuntimeError("probability tensor contains nan")
        return real_sample(logits, p, generators)

    prompts = random_prompts((20, 33, 12), seed=3)
    seeds = (None, 7, POISON_SEED)
    expected = [tokens_of(generate(worker, f"ref{i}", p, params(24, seeds[i]))) for i, p in
                enumerate(prompts[:2])]  # fmt: skip
    monkeypatch.setattr("workers.engine.model_runner.sample", poisoned)
    streams = [generate(worker, f"s{i}", p, params(24, seeds[i])) for i, p in enumerate(prompts)]
    with ThreadPoolExecutor(3) as pool:
        results = [pool.submit(tokens_of, s) for s in streams]
        with pytest.raises(grpc.RpcError) as failed:
            results[2].result()
        innocents = [r.result() for r in results[:2]]
    assert failed.value.code() == grpc.StatusCode.INTERNAL
    detail = failed.value.details() or ""
    assert (
        detail == "the engine failed on this request: RuntimeError: probability tensor contains nan"
    )
    assert innocents[0] == expected[0]  # greedy: the same tokens
    assert len(innocents[1]) == 24  # sampled: its own draws, unharmed


def test_role_changes_run_one_at_a_time_off_the_event_loop(config: EngineConfig) -> None:
    """Two role changes sent together: the second starts from the role the first left. The
    record is re-published off the event loop: while it blocks, the worker still answers."""
    release = threading.Event()

    def on_change() -> None:  # a slow Redis: the first publish waits for the test
        release.wait(CALL_S)

    with serving_worker(config, role="prefill") as worker, ThreadPoolExecutor(2) as pool:
        worker.servicer.on_change = on_change
        try:
            first = pool.submit(worker.stub.SetRole, pb.SetRoleRequest(role="mixed"))
            while not worker.servicer.draining:
                time.sleep(0.01)
            load = worker.stub.GetLoad(pb.LoadRequest(), timeout=10)  # the loop is free
            assert load.draining
            second = pool.submit(worker.stub.SetRole, pb.SetRoleRequest(role="mixed"))
            time.sleep(0.5)  # let the second arrive while the first is still publishing
        finally:
            release.set()
        replies = [first.result(CALL_S), second.result(CALL_S)]
        assert [(r.previous, r.role) for r in replies] == [("prefill", "mixed"), ("mixed", "mixed")]
        assert worker.servicer.role == "mixed" and not worker.servicer.draining
        assert worker.idle()


def test_an_adopt_that_raises_gives_its_pages_back(
    config: EngineConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = Engine(config)
    try:
        (prompt,) = random_prompts((40,), seed=4)
        assert engine.reserve("a1", prompt, 8, 30.0) is not None
        assert engine.num_free_blocks < engine.num_blocks

        def broken(*args: Any, **kwargs: Any) -> list[tuple[int, int]]:
            raise RuntimeError("commit failed")

        monkeypatch.setattr(engine.scheduler.blocks, "commit", broken)
        with pytest.raises(RuntimeError, match="commit failed"):
            engine.adopt("a1", prompt, 5, SamplingParams(max_tokens=8, temperature=0))
        assert engine.num_free_blocks == engine.num_blocks
        assert not engine.has_unfinished and "a1" not in engine.reservations
    finally:
        engine.close()


def test_a_landing_that_cannot_start_leaves_the_reservation_whole(
    config: EngineConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = Engine(config)
    held = Reservations(engine.scheduler, None, streaming=False)
    held.pool, held.lander = object(), Lander()  # type: ignore[assignment]

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise ConnectionError("pool unreachable")

    monkeypatch.setattr(reservations_module, "start_landing", broken)
    try:
        (prompt,) = random_prompts((40,), seed=5)
        seq = held.reserve("l1", prompt, 8, 30.0)
        assert seq is not None and "l1" in held and held.landing("l1") is None
        assert held.release("l1")
        assert engine.num_free_blocks == engine.num_blocks
    finally:
        held.close()
        engine.close()


def _reserve(**fields: Any) -> tuple[str, Any]:
    base = {"request_id": "ok", "prompt_token_ids": [1, 2], "max_tokens": 4}
    return "Reserve", pb.ReserveRequest(**{**base, **fields})


def _generate(**fields: Any) -> tuple[str, Any]:
    base = {"request_id": "ok", "prompt_token_ids": [1, 2], "params": params(4)}
    return "Generate", pb.GenerateRequest(**{**base, **fields})


NAN = pb.SamplingParams(max_tokens=4, temperature=math.nan)
REFUSED = {  # (verb, request, what the refusal names)
    "slash in id": (*_generate(request_id="a/b"), "request_id"),
    "empty id": (*_reserve(request_id=""), "request_id"),
    "long id": (*_generate(request_id="x" * 129), "request_id"),
    "space in id": (*_reserve(request_id="a b"), "request_id"),
    "lease of 49 days": (*_reserve(lease_ms=(1 << 32) - 1), "lease_ms"),
    "prompt over the model length": (*_generate(prompt_token_ids=[1] * 2049), "model length"),
    "resume over the model length": (*_generate(resume_token_ids=[1] * 2048), "model length"),
    "long cache salt": (*_reserve(cache_salt="s" * 257), "cache_salt"),
    "nan temperature": (*_generate(params=NAN), "temperature"),
    "token outside the vocabulary": (*_generate(prompt_token_ids=[1, 49152]), "token ids"),
}


@pytest.mark.parametrize("call", REFUSED.values(), ids=REFUSED.keys())
def test_the_grpc_entrance_refuses_what_cannot_be_served(
    worker: ServedWorker, call: tuple[str, Any, str]
) -> None:
    verb, request, named = call
    with pytest.raises(grpc.RpcError) as refused:
        reply = getattr(worker.stub, verb)(request, timeout=CALL_S)
        if verb == "Generate":
            tokens_of(reply)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert named in (refused.value.details() or ""), refused.value.details()

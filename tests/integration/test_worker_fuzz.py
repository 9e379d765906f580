"""Hypothesis fuzzing of a real worker's gRPC verbs (issue 16).

Each example is a sequence of calls with random fields: request ids from a small set (so
they collide) and some malformed ones, prompts with out-of-vocabulary ids, sampling fields
mostly valid and sometimes NaN, infinite or below the floor (what once ended every stream on
a worker), leases, first tokens and resumed outputs; ``Generate`` streams
are left open and read later, so calls interleave. Checked: every call ends (a deadline
would mean a hang) with a reply or a status the API documents, never UNKNOWN or INTERNAL;
after aborting every id used, the worker is idle with every page free.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from proto import worker_pb2 as pb
from tests.integration.worker_harness import ServedWorker, serving_worker
from workers.config import EngineConfig

IDS = ("a", "b", "c", "a/b", "", "x" * 200)
VALID_IDS = IDS[:3]
VOCAB = 49152
ALLOWED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,  # the mixed worker has no pool: no hand-off
    grpc.StatusCode.ABORTED,  # an Abort in the script ended an open call of its id
}
CALL_S = 15.0


@pytest.fixture(scope="module")
def worker(tiny_model_dir: Path) -> Iterator[ServedWorker]:
    config = EngineConfig(
        model=str(tiny_model_dir), block_tokens=16, kv_cache_mib=64, threads=1, max_model_len=256
    )
    with serving_worker(config) as served:
        yield served


wild = st.floats(allow_nan=True, allow_infinity=True, width=32)
temperatures = st.one_of(
    st.sampled_from([0.0, 0.0, 0.7, 1.0]), st.sampled_from([1e-40, 1e-5]), wild
)
top_ps = st.one_of(st.just(1.0), st.just(1.0), st.sampled_from([0.5, 0.9]), wild)
tokens = st.one_of(
    st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=40),
    st.lists(st.sampled_from([0, VOCAB - 1, VOCAB, (1 << 32) - 1]), max_size=3),
)
sampling = st.builds(
    pb.SamplingParams,
    max_tokens=st.integers(0, 24),
    temperature=temperatures,
    top_p=top_ps,
    top_k=st.one_of(st.just(0), st.integers(0, 1 << 20)),
    seed=st.one_of(st.none(), st.integers(0, (1 << 64) - 1)),
    stop=st.one_of(st.just([]), st.lists(st.text(min_size=1, max_size=4), max_size=2)),
    stop_token_ids=st.one_of(st.just([]), st.lists(st.integers(0, (1 << 32) - 1), max_size=3)),
    ignore_eos=st.booleans(),
)
ids = st.one_of(st.sampled_from(VALID_IDS), st.sampled_from(IDS))
generate = st.tuples(
    st.just("Generate"),
    st.builds(
        pb.GenerateRequest,
        request_id=ids,
        prompt_token_ids=tokens,
        params=sampling,
        first_token=st.one_of(st.none(), st.none(), st.integers(0, VOCAB + 5)),
        resume_token_ids=st.one_of(st.just([]), st.lists(st.integers(0, VOCAB + 5), max_size=3)),
    ),
)
calls = st.one_of(
    st.tuples(
        st.just("Reserve"),
        st.builds(
            pb.ReserveRequest,
            request_id=ids,
            prompt_token_ids=tokens,
            max_tokens=st.integers(0, 300),
            lease_ms=st.sampled_from([0, 1, 50, 30_000, (1 << 32) - 1]),
            cache_salt=st.text(max_size=4),
        ),
    ),
    generate,
    generate,
    generate,
    st.tuples(
        st.just("Prefill"),
        st.builds(pb.PrefillRequest, request_id=ids, prompt_token_ids=tokens, params=sampling),
    ),
    st.tuples(st.just("Abort"), st.builds(pb.AbortRequest, request_id=ids)),
    st.tuples(st.just("GetLoad"), st.just(pb.LoadRequest())),
)


def drain(stream: bool, call: Any) -> grpc.StatusCode:
    """Read a call (a ``Generate`` or ``Prefill`` stream, or a unary call's future) to its
    end; its status."""
    try:
        if stream:
            for _ in call:
                pass
        else:
            call.result(CALL_S)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(script=st.lists(calls, min_size=2, max_size=10))
def test_random_calls_never_crash_hang_or_leak(
    worker: ServedWorker, script: list[tuple[str, Any]]
) -> None:
    open_calls: list[tuple[bool, Any]] = []
    for verb, request in script:
        method = getattr(worker.stub, verb)
        if verb in ("Generate", "Prefill"):  # streams, read later: calls interleave
            open_calls.append((True, method(request, timeout=CALL_S)))
        else:
            open_calls.append((False, method.future(request, timeout=CALL_S)))
    statuses = [drain(*call) for call in open_calls]
    assert grpc.StatusCode.DEADLINE_EXCEEDED not in statuses  # nothing hung
    assert set(statuses) <= ALLOWED, statuses
    for request_id in IDS:
        worker.stub.Abort(pb.AbortRequest(request_id=request_id), timeout=CALL_S)
    deadline = time.monotonic() + 30
    while not worker.idle():
        assert time.monotonic() < deadline, "pages or requests left behind"
        time.sleep(0.05)

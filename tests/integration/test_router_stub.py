"""The router against a real Redis and real gRPC stub workers, through the official client.

See :mod:`tests.integration.router_harness` for the stubs' deterministic tokens.
"""

from __future__ import annotations

import http.client
import json
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families as parse
from transformers import AutoTokenizer

from kvpool.net import free_local_ports
from kvserve.bench.common import openai_client, stream_ttft
from kvserve.cluster.redis import RedisConfig, RedisProcess
from proto.tokenization import Tokenizer
from router.flow import tokenizer as tokenizer_module
from tests.integration.router_harness import (
    MODEL,
    Harness,
    StubWorker,
    expected_text,
    out_token,
    wait_for,
)


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    (port,) = free_local_ports(1)
    log = tmp_path_factory.mktemp("redis") / "redis.log"
    with RedisProcess(RedisConfig(port=port), log) as server:
        yield server.url


@pytest.fixture(scope="module")
def harness(redis_url: str, default_model_dir: Path) -> Iterator[Harness]:
    # d1 first: cache_aware ranks decode workers by running + waiting (its own pending
    # placements count on d1 until a report that never comes here), d2 reports 1000
    stubs = [StubWorker("p1", "prefill"), StubWorker("d1", "decode", 200),
             StubWorker("d2", "decode", 100, load={"running": 1000})]  # fmt: skip
    with Harness(redis_url, default_model_dir, stubs) as h:
        yield h


def test_disaggregated_completion(harness: Harness) -> None:
    prompt = [10, 20, 30, 40, 50, 60]
    out = harness.client().completions.create(model=MODEL, prompt=prompt, max_tokens=5)
    assert out.choices[0].text == expected_text(prompt, 5)
    assert out.choices[0].finish_reason == "length"
    assert out.usage is not None and out.usage.prompt_tokens == 6
    assert out.usage.completion_tokens == 5 and out.usage.total_tokens == 11
    assert out.usage.prompt_tokens_details is not None
    assert out.usage.prompt_tokens_details.cached_tokens == 3  # 1 local + 2 pool
    p1, d1 = harness.stubs["p1"], harness.stubs["d1"]
    rid = p1.called("Prefill")[-1]
    assert len(rid) == 32 and "/" not in rid and out.id == f"cmpl-{rid}"
    assert d1.called("Reserve")[-1] == rid and d1.called("Generate")[-1] == rid
    assert d1.first_tokens[rid] == 11
    assert rid not in d1.called("Abort") + p1.called("Abort")


@pytest.mark.parametrize("top", [0, 2])
def test_logprobs_cross_the_hand_off_in_the_workers_shape(harness: Harness, top: int) -> None:
    """The stubs answer logprobs as a worker must (the first token's from the prefill
    worker, the rest from the decode worker): the router passes them on, none refused as
    ill-shaped (the HTTP fuzz test once found a 502 here, when the stubs sent none)."""
    prompt = [10, 20, 30, 40, 50, 60, 70]
    client = harness.client()
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=3, logprobs=top)
    logprobs = out.choices[0].logprobs
    assert logprobs is not None and logprobs.token_logprobs == [-1.0] * 3
    assert [len(t) for t in logprobs.top_logprobs or []] == [max(top, 1)] * 3  # the token too
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hello there, how are you today?"}],
        max_tokens=3,
        logprobs=True,
        top_logprobs=top,
    )
    content = chat.choices[0].logprobs and chat.choices[0].logprobs.content
    assert content and [c.logprob for c in content] == [-1.0] * 3
    assert [len(c.top_logprobs) for c in content] == [top] * 3


def test_short_prompt_is_prefilled_by_the_decode_worker(harness: Harness) -> None:
    d1 = harness.stubs["d1"]
    reserves = len(d1.called("Reserve"))
    out = harness.client().completions.create(model=MODEL, prompt=[[7, 8]], max_tokens=3)
    assert out.choices[0].text == expected_text([7, 8], 3)
    assert out.usage is not None and out.usage.prompt_tokens_details is not None
    assert out.usage.prompt_tokens_details.cached_tokens == 1
    assert len(d1.called("Reserve")) == reserves  # no reservation: local prefill
    assert d1.called("Generate")[-1] not in d1.first_tokens


def test_first_token_that_finishes_frees_the_reservation(harness: Harness) -> None:
    out = harness.client().completions.create(model=MODEL, prompt=[5] * 9, max_tokens=1)
    assert out.choices[0].text == " t6" and out.choices[0].finish_reason == "length"
    rid = harness.stubs["p1"].called("Prefill")[-1]
    assert harness.stubs["d1"].called("Abort")[-1] == rid


def test_streaming_completion_with_usage(harness: Harness) -> None:
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    stream = harness.client().completions.create(
        model=MODEL, prompt=prompt, max_tokens=6, stream=True,
        stream_options={"include_usage": True}, extra_body={"top_k": 5},
    )  # fmt: skip
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected_text(prompt, 6)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 6


def test_the_benches_ttft_client_times_the_first_chunk_and_reads_the_cached_tokens(
    harness: Harness,
) -> None:
    """:func:`kvserve.bench.common.stream_ttft` (``bench prefix`` and ``bench ttft``) through
    the router: a first chunk came, and the cached tokens are the usage's (the stubs report
    1 local + (n - 1) // 2 pool tokens of an n-token prompt)."""
    client = openai_client(f"http://127.0.0.1:{harness.port}")
    seconds, cached = stream_ttft(client, MODEL, [7, 1, 8, 2, 8, 1, 8, 2, 8], 3)
    assert seconds > 0 and cached == 1 + 4


def test_chat_plain_and_streamed(harness: Harness, default_model_dir: Path) -> None:
    messages: Any = [{"role": "user", "content": "Hello there"}]
    tok = AutoTokenizer.from_pretrained(str(default_model_dir), local_files_only=True)
    ids = list(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                       return_dict=False))  # fmt: skip
    client = harness.client()
    out = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, seed=1)
    assert out.choices[0].message.content == expected_text(ids, 4)
    assert out.choices[0].message.role == "assistant"
    assert out.usage is not None and out.usage.prompt_tokens == len(ids)
    stream = client.chat.completions.create(
        model=MODEL, messages=messages, max_completion_tokens=4, stream=True
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected_text(ids, 4)
    assert chunks[-1].choices[0].finish_reason == "length"


def test_errors_in_openai_format(harness: Harness) -> None:
    client = harness.client()
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model=MODEL, prompt="hi", max_tokens=2, best_of=2)
    assert bad.value.body == {"message": "best_of is not supported (only 1)",
                              "type": "invalid_request_error", "param": "best_of",
                              "code": "unsupported_value"}  # fmt: skip
    with pytest.raises(openai.NotFoundError) as missing:
        client.completions.create(model="other", prompt="hi", max_tokens=2)
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as long:
        client.completions.create(model=MODEL, prompt="hi", max_tokens=5000)
    assert long.value.code == "context_length_exceeded"
    status, body = harness.get("/v1/completions", b'{"model": "' + b"x" * (2 << 20) + b'"}')
    assert status == 413 and json.loads(body)["error"]["code"] == "request_too_large"
    status, body = harness.get("/v1/completions", b"{")
    assert status == 400 and json.loads(body)["error"]["type"] == "invalid_request_error"


def test_refused_reservation_moves_to_the_next_decoder(harness: Harness) -> None:
    """(With every decoder refusing, the request waits: tests/integration/test_router_kv_wait.)"""
    d1, d2 = harness.stubs["d1"], harness.stubs["d2"]
    d1.refuse = True
    try:
        out = harness.client().completions.create(model=MODEL, prompt=[9] * 8, max_tokens=2)
        assert out.choices[0].text == expected_text([9] * 8, 2)
        rid = d2.called("Generate")[-1]
        assert d1.called("Reserve")[-1] == rid and rid not in d1.called("Generate")
    finally:
        d1.refuse = False


def test_requests_refused_by_draining_workers_go_elsewhere(harness: Harness) -> None:
    p1, d1, d2 = harness.stubs["p1"], harness.stubs["d1"], harness.stubs["d2"]
    client = harness.client()
    try:
        p1.refusing = {"Prefill"}  # remote prefill refused: the decode worker prefills
        prompt = [8] * 9
        out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=3)
        assert out.choices[0].text == expected_text(prompt, 3)
        rid = p1.called("Prefill")[-1]
        assert d1.called("Reserve")[-1] == rid and rid in d1.called("Abort")  # freed first
        assert d1.called("Generate")[-1] == rid and rid not in d1.first_tokens
        p1.refusing, d1.refusing = set(), {"Generate"}
        out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=3)
        assert out.choices[0].text == expected_text(prompt, 3)
        rid = p1.called("Prefill")[-1]  # d1 reserved, d2 took over with the first token
        assert rid in d1.called("Abort") and d2.first_tokens[rid] == 9
        out = client.completions.create(model=MODEL, prompt=[3, 4], max_tokens=2)  # local
        assert out.choices[0].text == expected_text([3, 4], 2)
        assert d2.called("Generate")[-1] == d1.called("Generate")[-1]
        d2.refusing = {"Generate"}  # nobody left to take it: 503
        with pytest.raises(openai.InternalServerError) as refused:
            client.completions.create(model=MODEL, prompt=[3, 4], max_tokens=2)
        assert refused.value.status_code == 503
    finally:
        p1.refusing = d1.refusing = d2.refusing = set()


@pytest.mark.parametrize("stream", [False, True])
def test_a_decode_worker_failing_mid_stream_is_resumed_on_another(
    harness: Harness, stream: bool
) -> None:
    d1, d2 = harness.stubs["d1"], harness.stubs["d2"]
    prompt = [21, 22, 23, 24, 25]
    d1.fail_after = d2.fail_after = None
    try:
        d1.fail_after = 2  # whichever decode worker starts it fails after 2 chunks...
        d2.fail_after = 2
        client = harness.client()
        if stream:
            chunks = client.completions.create(
                model=MODEL, prompt=prompt, max_tokens=8, stream=True
            )
            with pytest.raises(openai.APIError):  # ...and the other one too: error event
                "".join(c.choices[0].text for c in chunks if c.choices)
            d2.fail_after = None
            d1.fail_after = 2
        else:
            d2.fail_after = None  # ...only d1 fails: the request resumes on d2
        out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8)
        assert out.choices[0].text == expected_text(prompt, 8)  # nothing lost or repeated
        rid = d2.called("Generate")[-1]
        assert d1.called("Generate")[-1] == rid and rid in d1.called("Abort")
        assert d2.resumed[rid] == [out_token(prompt, i) for i in range(len(d2.resumed[rid]))]
        remote_first = rid in harness.stubs["p1"].called("Prefill")
        assert len(d2.resumed[rid]) == 2 + remote_first  # d1's two, after any remote first
    finally:
        d1.fail_after = d2.fail_after = None


@pytest.mark.parametrize("prompt", [[1, 2], [11, 12, 13, 14, 15, 16]])
def test_closing_a_stream_aborts_on_every_worker(harness: Harness, prompt: list[int]) -> None:
    p1, d1 = harness.stubs["p1"], harness.stubs["d1"]
    d1.delay_s = 0.05
    try:
        stream = harness.client().completions.create(
            model=MODEL, prompt=prompt, max_tokens=500, stream=True
        )
        for i, _ in enumerate(stream):
            if i == 3:
                break
        stream.close()
        rid = d1.called("Generate")[-1]
        assert wait_for(lambda: rid in d1.called("Abort"))
        disaggregated = rid in d1.first_tokens
        assert disaggregated == (len(prompt) > 4)
        assert (rid in p1.called("Abort")) == disaggregated
    finally:
        d1.delay_s = 0.0


def test_health_stats_and_metrics(harness: Harness) -> None:
    harness.client().completions.create(model=MODEL, prompt=[2] * 10, max_tokens=2)
    status, body = harness.get("/health")
    assert status == 200 and json.loads(body)["status"] == "ok"
    models = harness.client().models.list()
    assert [m.id for m in models.data] == [MODEL]
    status, body = harness.get("/v1/cache/stats")
    stats = json.loads(body)
    overall = stats["since_start"]["overall"]
    assert status == 200 and overall["requests"] >= 1
    assert (
        overall["prompt_tokens"]
        == overall["local_tokens"] + overall["pool_tokens"] + (overall["computed_tokens"])
    )
    assert stats["since_start"]["workers"]["p1"]["request_rates"]["pool"] == 1.0
    assert stats["pool_lookup"] == {"enabled": False, "connected": False}
    status, body = harness.get("/metrics")
    got = {
        (s.name, tuple(sorted(s.labels.items()))) for f in parse(body.decode()) for s in f.samples
    }
    model = ("model_name", MODEL)
    assert ("kvserve:requests_total", (("status", "ok"),)) in got
    source = ("source", "external_kv_transfer")
    assert ("vllm:prompt_tokens_by_source_total", (model, source, ("worker", "p1"))) in got
    assert ("kvserve:kv_transfer_bytes_total", (("direction", "write"),)) in got
    ttft = (("mode", "disagg"), model, ("worker", "p1"))
    assert ("vllm:time_to_first_token_seconds_count", ttft) in got
    assert ("vllm:request_success_total", (("finished_reason", "length"), model)) in got
    worker_state = ("vllm:num_requests", "vllm:kv_cache", "kvserve:worker_", "kvserve:kv_pages")
    assert not [name for name, _ in got if name.startswith(worker_state)]  # the workers' own


def test_health_without_workers(redis_url: str, default_model_dir: Path) -> None:
    with Harness(redis_url, default_model_dir, [StubWorker("p9", "prefill")]) as h:
        status, body = h.get("/health")
        assert status == 503 and "no decode-capable worker" in json.loads(body)["reason"]
        with pytest.raises(openai.InternalServerError) as none:
            h.client().completions.create(model=MODEL, prompt="hi", max_tokens=2)
        assert none.value.status_code == 503


def test_health_waits_for_the_tokenizer_loaded_in_the_background(
    redis_url: str, default_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The router loads the tokenizer once it sees a worker, not on the first request, and
    calls itself healthy only when that load is done."""
    gate = threading.Event()

    def held(model_dir: Path) -> Tokenizer:
        assert gate.wait(30)
        return Tokenizer(model_dir)

    monkeypatch.setattr(tokenizer_module, "Tokenizer", held)
    stubs = [StubWorker("d1", "decode")]
    with Harness(redis_url, default_model_dir, stubs, tokenizer_first=False) as h:

        def loading() -> bool:
            status, body = h.get("/health")
            return status == 503 and json.loads(body)["reason"] == "loading the tokenizer"

        assert wait_for(loading)
        gate.set()
        assert wait_for(lambda: h.get("/health")[0] == 200)
        out = h.client().completions.create(model=MODEL, prompt=[2] * 3, max_tokens=2)
        assert out.choices[0].finish_reason is not None


def test_client_gone_before_the_answer_aborts(harness: Harness) -> None:
    d1 = harness.stubs["d1"]
    d1.delay_s = 0.05
    try:
        client = harness.client().with_options(timeout=0.5)
        with pytest.raises(openai.APITimeoutError):
            client.completions.create(model=MODEL, prompt=[4, 4], max_tokens=500)
        rid = d1.called("Generate")[-1]
        assert wait_for(lambda: rid in d1.called("Abort"))
    finally:
        d1.delay_s = 0.0


def test_serve_runs_until_sigterm(redis_url: str) -> None:
    (port,) = free_local_ports(1)
    code = (
        "from kvpool.config import PoolConfig; from proto.registry import ClusterConfig; "
        "from router.config import RouterConfig; from router.main import serve; "
        f"serve(RouterConfig(router_port={port}, pool_lookup=False), "
        f"ClusterConfig(redis_url={redis_url!r}, cluster='empty'), PoolConfig())"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        assert wait_for(lambda: _port_answers(port), timeout=15)
        conn.request("GET", "/health")
        assert conn.getresponse().status == 503
        conn.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stderr is not None
        proc.stderr.close()


def _port_answers(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False

"""Requests wait for decode KV memory instead of being refused: the router's queue
(router/placement/kv_wait.py) against a real Redis and real gRPC stub workers.

A stub's ``refuse`` makes ``Reserve`` answer "no free pages now", ``too_big`` "can never fit"
(see :mod:`tests.integration.router_harness`). The stubs' load reports never change, so a
waiting request is woken by its queue's fallback (every ``RETRY_S``) or by another request
ending. Each step is awaited through the router's ``/metrics`` (bounded waits), never timed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from router.placement.kv_wait import RETRY_S
from tests.integration.router_harness import (
    MODEL,
    Harness,
    StubWorker,
    expected_text,
    running_redis,
    wait_for,
)
from tests.integration.test_disconnect import RawRequest

WAITING = "kvserve:requests_waiting_for_kv"
LONG = [9, 8, 7, 6, 5, 4, 3, 2]  # over the harness's threshold (4): disaggregated
SHORT = [3, 4]  # prefilled by the decode worker itself
WAIT_S = 60.0


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_redis(tmp_path_factory.mktemp("redis")) as url:
        yield url


def stubs() -> list[StubWorker]:
    # d1 ranks first (cache_aware: fewest running + waiting; d2 reports 1000 running)
    return [StubWorker("p1", "prefill"), StubWorker("d1", "decode", 200),
            StubWorker("d2", "decode", 100, load={"running": 1000})]  # fmt: skip


@pytest.fixture(scope="module")
def harness(redis_url: str, default_model_dir: Path) -> Iterator[Harness]:
    with Harness(redis_url, default_model_dir, stubs()) as h:
        yield h


@pytest.fixture(autouse=True)
def nobody_waits_after(harness: Harness) -> Iterator[None]:
    yield
    for stub in harness.stubs.values():
        stub.refuse = stub.too_big = False
    assert until(waiting(harness, 0))


def metric(harness: Harness, name: str) -> float:
    """The sum of the router's ``/metrics`` samples called ``name``."""
    status, body = harness.get("/metrics")
    assert status == 200
    return sum(
        s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
        if s.name == name
    )


class Call:
    """A completion in a thread: its text, or the error it raised."""

    def __init__(self, harness: Harness, prompt: list[int], n: int = 3) -> None:
        self.result: str | Exception | None = None
        self.response_id = ""
        self._thread = threading.Thread(target=self._run, args=(harness.client(), prompt, n))
        self._thread.start()

    def _run(self, client: openai.OpenAI, prompt: list[int], n: int) -> None:
        try:
            out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=n)
            self.response_id, self.result = out.id, out.choices[0].text
        except openai.APIError as exc:
            self.result = exc

    def join(self) -> str | Exception | None:
        self._thread.join(30)
        assert not self._thread.is_alive(), "the request never ended"
        return self.result

    @property
    def request_id(self) -> str:
        return self.response_id.removeprefix("cmpl-")


def refuse_all(harness: Harness) -> None:
    for stub in harness.stubs.values():
        stub.refuse = True


def waiting(harness: Harness, n: int) -> Callable[[], bool]:
    return lambda: metric(harness, WAITING) == n


def until(predicate: Callable[[], bool]) -> bool:
    """Wait for ``predicate`` (bounded, generously: the first request loads the tokenizer)."""
    return wait_for(predicate, WAIT_S)


def test_a_request_waits_for_pages_then_completes(harness: Harness) -> None:
    """Every decoder out of pages: no 503, the request waits (no prefill meanwhile, and few
    Reserve calls: woken, not polling), and completes once pages come free."""
    p1, d1, d2 = (harness.stubs[n] for n in ("p1", "d1", "d2"))
    prefills, reserves = len(p1.called("Prefill")), len(d1.called("Reserve"))
    waited = metric(harness, "kvserve:kv_wait_seconds_count")
    refuse_all(harness)
    call = Call(harness, LONG)
    assert until(waiting(harness, 1))
    assert wait_for(lambda: len(d1.called("Reserve")) > reserves + 1, RETRY_S * 3)
    assert len(p1.called("Prefill")) == prefills and call.result is None
    d2.refuse = False
    assert call.join() == expected_text(LONG, 3)
    assert d2.called("Generate")[-1] == call.request_id
    assert len(d1.called("Reserve")) - reserves < 10
    assert metric(harness, WAITING) == 0
    assert metric(harness, "kvserve:kv_wait_seconds_count") == waited + 1


def test_waiting_requests_go_first_come_first_served(harness: Harness) -> None:
    """A local request that arrives while a disaggregated one waits takes its turn behind
    it: it is not sent to the decode worker before the earlier one has its pages."""
    d1 = harness.stubs["d1"]
    refuse_all(harness)
    first = Call(harness, LONG)
    assert until(waiting(harness, 1))
    second = Call(harness, SHORT)
    assert until(waiting(harness, 2))
    d1.refuse = False
    assert first.join() == expected_text(LONG, 3)
    assert second.join() == expected_text(SHORT, 3)
    calls = d1.calls
    reserved = max(i for i, c in enumerate(calls) if c == ("Reserve", first.request_id))
    assert calls.index(("Generate", second.request_id)) > reserved


def test_a_request_that_can_never_fit_is_refused_at_once(harness: Harness) -> None:
    """Too big for every decoder: 400 with the worker's reason, nothing waits. Too big for
    one only: it waits for the other."""
    d1, d2 = harness.stubs["d1"], harness.stubs["d2"]
    d1.too_big = d2.too_big = True
    with pytest.raises(openai.BadRequestError) as never:
        harness.client().completions.create(model=MODEL, prompt=LONG, max_tokens=3)
    assert "KV pages" in never.value.message
    d2.too_big, d2.refuse = False, True
    call = Call(harness, LONG)
    assert until(waiting(harness, 1))
    d2.refuse = False
    assert call.join() == expected_text(LONG, 3)
    assert d2.called("Generate")[-1] == call.request_id


def test_a_client_that_leaves_while_waiting_leaves_no_trace(harness: Harness) -> None:
    """Dropped while waiting: it leaves the queue at once, no worker hears of it but for
    the refused Reserve calls, and the next request does not wait behind it."""
    refuse_all(harness)
    before = {name: len(stub.calls) for name, stub in harness.stubs.items()}
    raw: dict[str, Any] = {"model": MODEL, "prompt": LONG, "max_tokens": 3, "stream": True}
    victim = RawRequest(f"http://127.0.0.1:{harness.port}", raw)
    assert until(waiting(harness, 1))
    victim.disconnect()
    assert until(waiting(harness, 0))
    heard = [c for n, stub in harness.stubs.items() for c in stub.calls[before[n] :]]
    assert heard and {verb for verb, _ in heard} == {"Reserve"}
    for stub in harness.stubs.values():
        stub.refuse = False
    out = harness.client().completions.create(model=MODEL, prompt=SHORT, max_tokens=2)
    assert out.choices[0].text == expected_text(SHORT, 2)


def test_a_request_whose_deadline_passes_while_waiting_gets_504(
    redis_url: str, default_model_dir: Path
) -> None:
    options = {"request_timeout_s": 1.0}
    with Harness(redis_url, default_model_dir, stubs(), router_options=options) as short:
        refuse_all(short)
        with pytest.raises(openai.APIStatusError) as late:
            short.client().completions.create(model=MODEL, prompt=LONG, max_tokens=3)
        assert late.value.status_code == 504 and late.value.code == "timeout"
        assert "KV cache" in late.value.message
        assert metric(short, WAITING) == 0
        assert not short.stubs["p1"].called("Prefill")

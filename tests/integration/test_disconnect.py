"""A client that goes away in any phase of a disaggregated request leaves no page held.

One real one-machine cluster (Redis, mooncake_master, router, 1 prefill + 1 decode worker
on the tiny model) serves every case. The client speaks raw HTTP over a socket, so it can
drop the connection at a chosen point; the phase is found by watching the workers
(``GetLoad``), never by sleeping:

- ``queued``: the prefill worker is busy with a long prompt and the request waits in its
  queue (the decode worker already holds its reservation);
- ``prefilling``: the prefill worker has computed part of the prompt, not all of it;
- ``transferring``: the prefill is done (the prefill worker sampled the first token; for a
  stream, the response has started) and the decode side is taking the request over;
- ``decoding``: the decode worker is producing tokens.

Each in a stream and in a plain request. After each disconnect, within a bounded wait,
every worker is idle and no page is referenced by any request or reservation: a page with
no reference is on the free list (prefix-cached or not), so that is exactly
``free_pages == total_pages`` together with nothing running, waiting or reserved. The
router's reservation lease is longer than the wait, so a reservation only the lease would
free fails the check. Each case also checks that the request was cut short (the work it
would have caused did not all happen), i.e. that the abort reached the worker.
"""

from __future__ import annotations

import json
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from kvserve.cluster.faults import is_idle
from kvserve.cluster.launch import Cluster
from proto import worker_pb2 as pb
from proto import worker_pb2_grpc
from proto.channels import sync_channel
from proto.grpc_auth import MONITOR
from tests.tiny_cluster import MODEL_NAME, tiny_cluster_spec

IDLE_WAIT_S = 20.0
LEASE_S = 30.0
"""The router's reservation lease: longer than IDLE_WAIT_S, so that only an abort frees a
reservation in time; what a failed case leaked has expired before the next case starts."""
PHASE_WAIT_S = 60.0
CHUNK = 16
LONG_PROMPT = 1800
"""Tokens of a prompt whose chunked prefill (CHUNK tokens a step) takes over 100 steps."""
POLL_S = 0.02
"""Between two looks at the workers (two ``GetLoad`` calls), while a phase is awaited: the
phases last a second or more; looking every 5 ms took 50 s of CPU for the file, this 32 s."""
VOCAB = 49000


@pytest.fixture(scope="module")
def cluster(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    spec = tiny_cluster_spec(
        tiny_model_dir,
        tmp_path_factory.mktemp("cluster"),
        engine={"max_num_batched_tokens": CHUNK},
        policy="round_robin",
        router_args=("--reserve-lease-s", str(LEASE_S)),
    )
    with Cluster(spec).start() as running:
        warm_up = RawRequest(running.router_url, body(fresh_prompt(40), 2, stream=False))
        assert warm_up.read_all()[0] == 200  # the first request loads what later ones reuse
        yield running


class Workers:
    """``GetLoad`` on the prefill and the decode worker."""

    def __init__(self, cluster: Cluster) -> None:
        addresses, config = cluster.worker_addresses, cluster.cluster_config
        self._channels = {  # the monitor identity: GetLoad is all it asks
            "prefill": sync_channel(addresses["prefill"][0], config, identity=MONITOR),
            "decode": sync_channel(addresses["decode"][0], config, identity=MONITOR),
        }
        self._stubs = {n: worker_pb2_grpc.WorkerStub(c) for n, c in self._channels.items()}

    def load(self, name: str) -> pb.LoadReport:
        report: pb.LoadReport = self._stubs[name].GetLoad(pb.LoadRequest(), timeout=10)
        return report

    def loads(self) -> dict[str, pb.LoadReport]:
        return {name: self.load(name) for name in self._stubs}

    def wait_for(
        self, what: str, ready: Callable[[dict[str, pb.LoadReport]], bool], timeout: float
    ) -> dict[str, pb.LoadReport]:
        """Poll until ``ready(loads)``; fail naming ``what`` and the last loads if never."""
        deadline = time.monotonic() + timeout
        while True:
            loads = self.loads()
            if ready(loads):
                return loads
            if time.monotonic() > deadline:
                raise AssertionError(f"never saw {what}: {describe(loads)}")
            time.sleep(POLL_S)

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()


def describe(loads: dict[str, pb.LoadReport]) -> dict[str, str]:
    return {
        n: f"running={r.running} waiting={r.waiting} reserved={r.reserved} "
        f"free_pages={r.free_pages}/{r.total_pages} queued_prefill={r.queued_prefill_tokens} "
        f"output_tokens={r.output_tokens}"
        for n, r in loads.items()
    }


@pytest.fixture(scope="module")
def workers(cluster: Cluster) -> Iterator[Workers]:
    w = Workers(cluster)
    yield w
    w.close()


@pytest.fixture
def idle_before_and_after(workers: Workers) -> Iterator[None]:
    """Every case starts from, and must return to, workers that hold no page. (A case
    that failed may have leaked a reservation: its lease frees it before the next one.)"""
    workers.wait_for(
        "every worker idle before the case",
        lambda loads: all(is_idle(r) for r in loads.values()),
        LEASE_S + IDLE_WAIT_S,
    )
    yield
    reports = workers.wait_for(
        "every worker idle with zero pages held",
        lambda loads: all(is_idle(r) for r in loads.values()),
        IDLE_WAIT_S,
    )
    assert all(is_idle(r) for r in reports.values())


class RawRequest:
    """``POST /v1/completions`` over a bare socket: read as much as wanted, then drop it."""

    def __init__(self, router_url: str, body: dict[str, Any]) -> None:
        url = urlsplit(router_url)
        host, port = url.hostname or "127.0.0.1", url.port or 80
        payload = json.dumps(body).encode()
        head = (
            f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
            "Connection: close\r\n\r\n"
        )
        self.sock = socket.create_connection((host, port), timeout=PHASE_WAIT_S)
        self.sock.sendall(head.encode() + payload)
        self.received = b""

    def read_until(self, done: Callable[[bytes], bool]) -> None:
        """Read until ``done(everything received)``; fail if the server closes first."""
        while not done(self.received):
            data = self.sock.recv(65536)
            assert data, f"the server closed the connection: {self.received!r}"
            self.received += data

    def read_all(self) -> tuple[int, bytes]:
        """The whole response (the server closes after it): status and body."""
        while data := self.sock.recv(65536):
            self.received += data
        self.sock.close()
        head, _, body = self.received.partition(b"\r\n\r\n")
        return int(head.split(b" ", 2)[1]), body

    def disconnect(self) -> None:
        self.sock.close()


def started(received: bytes) -> bool:
    """The response head came: for a stream, the router has the prefill's first token."""
    return b"\r\n\r\n" in received


def events(received: bytes) -> int:
    return received.count(b"data: ")


def body(prompt: list[int], max_tokens: int, stream: bool) -> dict[str, Any]:
    return {
        "model": MODEL_NAME,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": stream,
    }


_seeds = iter(range(1, 1 << 30))


def fresh_prompt(length: int) -> list[int]:
    """A prompt no earlier request shares a block with (so nothing comes from a cache)."""
    rng = random.Random(next(_seeds) * 7919)
    return [rng.randrange(100, VOCAB) for _ in range(length)]


@dataclass
class Baseline:
    """Counters before a case, to tell what the case itself caused."""

    prefill_before: int
    decode_before: int

    @classmethod
    def of(cls, workers: Workers) -> Baseline:
        loads = workers.loads()
        return cls(loads["prefill"].output_tokens, loads["decode"].output_tokens)

    def prefill_outputs(self, loads: dict[str, pb.LoadReport]) -> int:
        """Tokens the prefill worker sampled since (one per finished prefill)."""
        return loads["prefill"].output_tokens - self.prefill_before

    def decode_outputs(self, loads: dict[str, pb.LoadReport]) -> int:
        return loads["decode"].output_tokens - self.decode_before


STREAM = pytest.mark.parametrize("stream", [True, False], ids=["stream", "plain"])


@STREAM
@pytest.mark.usefixtures("idle_before_and_after")
def test_disconnect_while_queued_on_the_prefill_worker(
    cluster: Cluster, workers: Workers, stream: bool
) -> None:
    """Dropped while waiting behind another prompt: its queue entry and its reservation go,
    it is never prefilled, and the request ahead of it completes normally."""
    before = Baseline.of(workers)
    blocker = RawRequest(cluster.router_url, body(fresh_prompt(LONG_PROMPT), 2, stream=False))
    answer: list[tuple[int, bytes]] = []
    reader = threading.Thread(target=lambda: answer.append(blocker.read_all()))
    reader.start()
    try:
        workers.wait_for(
            "the long prompt prefilling",
            lambda loads: loads["prefill"].running == 1,
            PHASE_WAIT_S,
        )
        victim = RawRequest(cluster.router_url, body(fresh_prompt(64), 200, stream))
        loads = workers.wait_for(
            "the request queued behind it",
            lambda loads: loads["prefill"].waiting == 1 and loads["decode"].reserved == 2,
            PHASE_WAIT_S,
        )
        assert loads["prefill"].running == 1
        victim.disconnect()
    finally:
        reader.join(PHASE_WAIT_S * 2)
    assert answer and answer[0][0] == 200, answer
    assert b'"finish_reason":"length"' in answer[0][1]
    workers.wait_for(
        "the prefill worker idle", lambda loads: is_idle(loads["prefill"]), IDLE_WAIT_S
    )
    assert before.prefill_outputs(workers.loads()) == 1  # the blocker's first token only


@STREAM
@pytest.mark.usefixtures("idle_before_and_after")
def test_disconnect_while_prefilling(cluster: Cluster, workers: Workers, stream: bool) -> None:
    """Dropped with its prompt part computed: the prefill stops and no token is sampled."""
    before = Baseline.of(workers)
    victim = RawRequest(cluster.router_url, body(fresh_prompt(LONG_PROMPT), 200, stream))
    workers.wait_for(
        "the prompt partly prefilled",
        lambda loads: (
            loads["prefill"].running == 1
            and 0 < loads["prefill"].queued_prefill_tokens < LONG_PROMPT - CHUNK
            and loads["decode"].reserved == 1
        ),
        PHASE_WAIT_S,
    )
    victim.disconnect()
    workers.wait_for(
        "the prefill worker idle", lambda loads: is_idle(loads["prefill"]), IDLE_WAIT_S
    )
    assert before.prefill_outputs(workers.loads()) == 0


@STREAM
@pytest.mark.usefixtures("idle_before_and_after")
def test_disconnect_between_prefill_and_decode(
    cluster: Cluster, workers: Workers, stream: bool
) -> None:
    """Dropped as soon as the prefill is done (its first token sampled; for a stream, the
    response started with it), while the decode worker takes the request over: the
    reservation (or the adopted request) is freed and decoding stops early."""
    before = Baseline.of(workers)
    max_tokens = 200
    victim = RawRequest(cluster.router_url, body(fresh_prompt(600), max_tokens, stream))
    if stream:
        victim.read_until(started)
        assert victim.received.startswith(b"HTTP/1.1 200"), victim.received
    else:
        workers.wait_for(
            "the prefill done",
            lambda loads: before.prefill_outputs(loads) == 1,
            PHASE_WAIT_S,
        )
    victim.disconnect()
    workers.wait_for("the decode worker idle", lambda loads: is_idle(loads["decode"]), IDLE_WAIT_S)
    assert before.prefill_outputs(workers.loads()) == 1
    assert before.decode_outputs(workers.loads()) < max_tokens - 1


@STREAM
@pytest.mark.usefixtures("idle_before_and_after")
def test_disconnect_while_decoding(cluster: Cluster, workers: Workers, stream: bool) -> None:
    """Dropped after some tokens were decoded: the decode worker stops and frees it all."""
    before = Baseline.of(workers)
    max_tokens = 1000
    victim = RawRequest(cluster.router_url, body(fresh_prompt(40), max_tokens, stream))
    if stream:
        victim.read_until(lambda received: events(received) >= 3)
    else:
        workers.wait_for(
            "tokens decoded",
            lambda loads: loads["decode"].running == 1 and before.decode_outputs(loads) >= 3,
            PHASE_WAIT_S,
        )
    victim.disconnect()
    workers.wait_for("the decode worker idle", lambda loads: is_idle(loads["decode"]), IDLE_WAIT_S)
    assert before.decode_outputs(workers.loads()) < max_tokens - 1

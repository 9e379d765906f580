"""Faults on a running one-machine :class:`~kvserve.cluster.launch.Cluster`, and the checks that
follow them: used by the fault tests and by ``kvserve chaos``.

- :func:`kill` (SIGKILL), :func:`freeze` / :func:`thaw` (SIGSTOP / SIGCONT) any process by
  its cluster name (a worker, ``router``, ``redis``, ``mooncake_master``);
- :func:`load_of` asks a worker for its :class:`LoadReport` over gRPC (TLS when the
  cluster has it; as the ``monitor`` identity, which may only observe); :class:`ServingProbe`
  asks it again and again over an open channel, to find the worker serving a stream;
- :func:`router_metric` reads a counter or gauge from the router's ``/metrics``;
- :func:`wait_routable` waits until the router sees every running worker again;
- :func:`held_pages` is what a worker holds for requests and reservations (a page in the
  local prefix cache but used by nobody counts as free); :func:`wait_idle` waits until
  every named worker is idle and returns what each still holds (all 0: nothing leaked).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterable

import grpc
from prometheus_client.parser import text_string_to_metric_families

from kvserve.cluster.health import router_workers
from kvserve.cluster.launch import Cluster
from proto import worker_pb2 as pb
from proto.channels import sync_channel
from proto.grpc_auth import MONITOR
from proto.worker_pb2_grpc import WorkerStub

log = logging.getLogger(__name__)

IDLE_POLL_S = 0.2


def kill(cluster: Cluster, name: str) -> None:
    """SIGKILL ``name`` (no clean shutdown: a crash) and reap it."""
    proc = cluster.process(name)
    proc.kill()
    if proc.pid is not None:
        proc.wait(10)


def freeze(cluster: Cluster, name: str) -> None:
    """SIGSTOP ``name``: it holds its sockets but answers nothing (a hung peer)."""
    cluster.process(name).send_signal(signal.SIGSTOP)


def thaw(cluster: Cluster, name: str) -> None:
    cluster.process(name).send_signal(signal.SIGCONT)


def monitor_channel(cluster: Cluster, name: str) -> grpc.Channel:
    """A channel to worker ``name`` as the ``monitor`` identity (TLS when the cluster has
    it); the caller closes it."""
    return sync_channel(cluster.plan_of(name).address, cluster.cluster_config, identity=MONITOR)


def load_of(cluster: Cluster, name: str, timeout: float = 2.0) -> pb.LoadReport:
    """Worker ``name``'s load report; raises ``grpc.RpcError`` if it does not answer in
    time."""
    with monitor_channel(cluster, name) as channel:
        report: pb.LoadReport = WorkerStub(channel).GetLoad(pb.LoadRequest(), timeout=timeout)
        return report


def router_metric(cluster: Cluster, name: str, **labels: str) -> float:
    """The sum of the router's ``/metrics`` samples called ``name`` whose labels include
    ``labels`` (0 when there is none); with several routers, summed over all of them (each
    asked directly; a router started again counts from 0)."""
    total = 0.0
    for url in cluster.routers.urls.values():
        with urllib.request.urlopen(url + "/metrics", timeout=10) as reply:
            text = reply.read().decode()
        total += sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
        )
    return total


def held_pages(report: pb.LoadReport) -> int:
    """Pages a worker holds for requests or reservations (cached but unused ones are free)."""
    return report.total_pages - report.free_pages


def is_idle(report: pb.LoadReport) -> bool:
    return not (report.running or report.waiting or report.reserved or held_pages(report))


def wait_idle(
    cluster: Cluster, names: Iterable[str] | None = None, timeout: float = 30.0
) -> dict[str, int]:
    """Wait until every named running worker (default: all that run) is idle, or the
    timeout; returns the pages each still holds then (a worker that does not answer
    counts as -1)."""
    wanted = cluster.worker_names if names is None else names
    todo = [n for n in wanted if cluster.worker(n).running]
    deadline = time.monotonic() + timeout
    while True:
        held: dict[str, int] = {}
        for name in todo:
            try:
                report = load_of(cluster, name)
                held[name] = 0 if is_idle(report) else max(1, held_pages(report))
            except grpc.RpcError as exc:
                log.warning("%s did not answer GetLoad: %s", name, exc)
                held[name] = -1
        if not any(held.values()) or time.monotonic() > deadline:
            return held
        time.sleep(IDLE_POLL_S)


OUTPUT_BEGUN = 4
"""Tokens a worker outputs after taking a request before :meth:`ServingProbe.serving` names
it: the router has then had some of them, so a fault is one after output began."""


class ServingProbe:
    """Which worker in ``role`` (as it reports now: roles change at run time) took a
    request sent after the probe opened (a context manager) and has begun its output: the
    one whose count of requests taken rose since (a decode worker counts a request when it
    adopts it, as its decoding starts) and whose count of tokens output rose by
    :data:`OUTPUT_BEGUN`. A worker running requests it took before is never named, so a test's
    background load does not stand in for its stream. Each lookup asks every worker at once
    over a channel kept open for the probe's life, so a loaded machine answers it while a
    short stream still runs; a channel whose call failed is opened again (one left in
    reconnect back-off fails every call at once). :attr:`seen` counts what the lookups saw,
    for the message of a test that found nobody."""

    def __init__(self, cluster: Cluster, role: str, timeout: float = 5.0) -> None:
        self.cluster, self.role, self.timeout = cluster, role, timeout
        self.seen: collections.Counter[str] = collections.Counter()
        self._channels: dict[str, grpc.Channel] = {}
        self._taken: dict[str, int] = {}
        """Worker -> requests it had taken when first asked (the baseline)."""
        self._output: dict[str, int] = {}
        """Worker -> tokens it had output when first asked (the baseline)."""

    def __enter__(self) -> ServingProbe:
        """Open a channel to every running worker, wait (up to the timeout each) until it is
        connected and note what it has taken so far; one that does not answer yet is asked
        again at each lookup."""
        try:
            for name in self.cluster.worker_names:
                if self.cluster.worker(name).running:
                    self._open(name)
            self._ask()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()

    def serving(self) -> str | None:
        """The worker that took a request since the probe opened and has output tokens since
        (None: none yet): one whose count of requests taken rose since its first answer, and
        whose count of tokens output rose by :data:`OUTPUT_BEGUN` (so its output has begun:
        a fault before that is a hand-off that did not take, not a fault mid-stream)."""
        reports = {n: r for n, r in self._ask().items() if r.role == self.role}
        rose = [
            n
            for n, r in reports.items()
            if r.requests > self._taken[n] and r.output_tokens >= self._output[n] + OUTPUT_BEGUN
        ]
        return rose[0] if rose else None

    def _open(self, name: str, wait: bool = True) -> None:
        channel = self._channels[name] = monitor_channel(self.cluster, name)
        if wait:
            with contextlib.suppress(grpc.FutureTimeoutError):
                grpc.channel_ready_future(channel).result(timeout=self.timeout)

    def _ask(self) -> dict[str, pb.LoadReport]:
        """Every running worker's load report, asked at once; those that answered."""
        calls = {
            name: WorkerStub(channel).GetLoad.future(pb.LoadRequest(), timeout=self.timeout)
            for name, channel in self._channels.items()
            if self.cluster.worker(name).running
        }
        reports: dict[str, pb.LoadReport] = {}
        for name, call in calls.items():
            try:
                report = reports[name] = call.result()
            except grpc.RpcError as exc:
                self.seen[f"{name}: {exc.code().name}"] += 1
                self._channels.pop(name).close()
                self._open(name, wait=False)
                continue
            self._taken.setdefault(name, report.requests)
            self._output.setdefault(name, report.output_tokens)
            self.seen[
                f"{name}: {report.role}, running {report.running}, taken {report.requests}"
            ] += 1
        return reports


def routable(cluster: Cluster) -> int:
    """How many workers the router's ``/health`` counts as live (0 if it does not answer)."""
    return router_workers(cluster.router_url)


def wait_routable(cluster: Cluster, timeout: float = 30.0) -> bool:
    """Wait until the router counts every running worker as live; False on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        running = sum(cluster.worker(n).running for n in cluster.worker_names)
        if routable(cluster) >= running:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(IDLE_POLL_S)

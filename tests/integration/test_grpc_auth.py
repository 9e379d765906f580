"""Worker gRPC against callers without the cluster's token (:mod:`proto.grpc_auth`): one real
``kvserve worker`` (mixed role, tiny model, real Redis and mooncake_master) started, as the
launcher starts it, with a worker's grant in ``KVSERVE_CLUSTER_SECRET`` (never the secret),
for the whole module.

- a caller with no token, or with a token from another secret, gets UNAUTHENTICATED on
  every verb and on the health service, and changes nothing: the role, the pages, the
  reservation another caller holds, the counters all stay as they were;
- the ``monitor`` identity may GetLoad and check health but gets PERMISSION_DENIED on every
  verb that acts;
- the ``router`` identity may call every verb;
- whoever holds a worker's grant (a worker that was broken into) cannot make the router's
  token, so it too may only observe.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from proto import channels
from proto import worker_pb2 as pb
from proto.credentials import NotGrantedError
from proto.grants import grant
from proto.grpc_auth import MONITOR, ROUTER
from proto.prefill import prefill_answer
from proto.registry import ClusterConfig
from proto.trust import new_secret
from proto.worker_pb2_grpc import WorkerStub
from tests.integration.worker_process import start_worker, wait_serving, worker_services

SECRET = new_secret()
CLUSTER = ClusterConfig(cluster_secret=SECRET)
PROMPT = list(range(100, 140))
GREEDY = pb.SamplingParams(max_tokens=4, temperature=0)
HELD = "held"
"""A reservation the router holds while strangers call: their Abort must not free it."""

GRAB = pb.ReserveRequest(request_id="grab", prompt_token_ids=PROMPT, max_tokens=4,
                        lease_ms=3_600_000)  # fmt: skip
PREFILL = pb.PrefillRequest(request_id="p", prompt_token_ids=PROMPT, params=GREEDY)
GENERATE = pb.GenerateRequest(request_id="g", prompt_token_ids=PROMPT, params=GREEDY)

Call = Callable[[grpc.Channel], Any]
ACTS: dict[str, Call] = {
    "SetRole": lambda ch: WorkerStub(ch).SetRole(pb.SetRoleRequest(role="prefill"), timeout=30),
    "Abort": lambda ch: WorkerStub(ch).Abort(pb.AbortRequest(request_id=HELD), timeout=30),
    "Reserve": lambda ch: WorkerStub(ch).Reserve(GRAB, timeout=30),
    "Prefill": lambda ch: prefill_answer(WorkerStub(ch).Prefill(PREFILL, timeout=60)),
    "Generate": lambda ch: list(WorkerStub(ch).Generate(GENERATE, timeout=60)),
}
"""One call of every verb that acts on the worker."""
OBSERVES: dict[str, Call] = {
    "GetLoad": lambda ch: WorkerStub(ch).GetLoad(pb.LoadRequest(), timeout=30),
    "Health": lambda ch: health_pb2_grpc.HealthStub(ch).Check(
        health_pb2.HealthCheckRequest(), timeout=30
    ),
}
"""The calls that only observe."""


@dataclass(frozen=True)
class Served:
    address: str

    @contextmanager
    def dial(self, cluster: ClusterConfig, identity: str = MONITOR) -> Iterator[grpc.Channel]:
        with channels.sync_channel(self.address, cluster, identity) as channel:
            yield channel

    def load(self) -> pb.LoadReport:
        with self.dial(CLUSTER) as channel:
            report: pb.LoadReport = OBSERVES["GetLoad"](channel)
        return report


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[Served]:
    log_dir = tmp_path_factory.mktemp("grpc-auth")
    with worker_services(log_dir) as services:
        env = {"KVSERVE_CLUSTER_SECRET": grant(SECRET, "worker")}
        proc, address = start_worker(
            "w-auth", tiny_model_dir, services, log_dir, "--role", "mixed", env=env
        )
        try:
            wait_serving(address, proc, CLUSTER)
            yield Served(address)
        finally:
            proc.stop(30)


def codes(channel: grpc.Channel, calls: dict[str, Call]) -> dict[str, grpc.StatusCode]:
    """The status each of ``calls`` ends with on ``channel`` (OK when it returned)."""
    out = {}
    for name, call in calls.items():
        try:
            call(channel)
            out[name] = grpc.StatusCode.OK
        except grpc.RpcError as exc:
            out[name] = exc.code()
    return out


def state(report: pb.LoadReport) -> dict[str, Any]:
    """What a caller could have changed: role, drain, pages, work, counters."""
    fields = ("role", "draining", "waiting", "running", "reserved", "free_pages",
              "requests", "output_tokens", "prompt_tokens_computed")  # fmt: skip
    return {f: getattr(report, f) for f in fields}


@contextmanager
def held_reservation(worker: Served) -> Iterator[None]:
    """The router holds :data:`HELD` (some pages) during the block; it is aborted after."""
    request = pb.ReserveRequest(request_id=HELD, prompt_token_ids=PROMPT, max_tokens=4,
                                lease_ms=600_000)  # fmt: skip
    with worker.dial(CLUSTER, ROUTER) as router:
        assert WorkerStub(router).Reserve(request, timeout=30).ok
        try:
            yield
        finally:
            found = WorkerStub(router).Abort(pb.AbortRequest(request_id=HELD), timeout=30).found
    assert found, "the router's reservation was gone: a refused Abort freed it"


@contextmanager
def unchanged(worker: Served) -> Iterator[None]:
    before = state(worker.load())
    assert before["role"] == "mixed" and before["reserved"] == 1
    yield
    assert state(worker.load()) == before


@contextmanager
def plain(worker: Served) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(worker.address) as channel:  # no token at all
        yield channel


@contextmanager
def other_secret(worker: Served) -> Iterator[grpc.Channel]:
    with worker.dial(ClusterConfig(cluster_secret=new_secret()), ROUTER) as channel:
        yield channel


@pytest.mark.timeout(300)
@pytest.mark.parametrize("stranger", [plain, other_secret])
def test_callers_without_the_token_are_unauthenticated_and_change_nothing(
    worker: Served, stranger: Callable[[Served], Any]
) -> None:
    with held_reservation(worker), unchanged(worker), stranger(worker) as channel:
        got = codes(channel, {**ACTS, **OBSERVES})
    assert got == dict.fromkeys((*ACTS, *OBSERVES), grpc.StatusCode.UNAUTHENTICATED)


@pytest.mark.timeout(300)
def test_monitor_observes_but_may_not_act(worker: Served) -> None:
    with held_reservation(worker), unchanged(worker), worker.dial(CLUSTER, MONITOR) as channel:
        assert codes(channel, OBSERVES) == dict.fromkeys(OBSERVES, grpc.StatusCode.OK)
        assert codes(channel, ACTS) == dict.fromkeys(ACTS, grpc.StatusCode.PERMISSION_DENIED)
        assert OBSERVES["Health"](channel).status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.timeout(300)
def test_a_workers_grant_may_only_observe(worker: Served) -> None:
    """What a peer worker holds cannot steer this one: no router token can be made from it,
    and its monitor token is refused every verb that acts."""
    peer = ClusterConfig(cluster_secret=grant(SECRET, "worker"))
    with pytest.raises(NotGrantedError, match="router"), worker.dial(peer, ROUTER):
        pass
    with held_reservation(worker), unchanged(worker), worker.dial(peer, MONITOR) as channel:
        assert codes(channel, OBSERVES) == dict.fromkeys(OBSERVES, grpc.StatusCode.OK)
        assert codes(channel, ACTS) == dict.fromkeys(ACTS, grpc.StatusCode.PERMISSION_DENIED)


@pytest.mark.timeout(300)
def test_router_may_call_every_verb(worker: Served) -> None:
    with worker.dial(CLUSTER, ROUTER) as channel:
        stub = WorkerStub(channel)
        assert stub.Reserve(GRAB, timeout=30).ok and worker.load().reserved == 1
        assert stub.Abort(pb.AbortRequest(request_id=GRAB.request_id), timeout=30).found
        first = prefill_answer(stub.Prefill(PREFILL, timeout=60)).first_token
        chunks = list(stub.Generate(GENERATE, timeout=60))
        assert chunks[0].token_ids[0] == first  # greedy: the same first token
        assert sum(len(c.token_ids) for c in chunks) == GREEDY.max_tokens
        for role, previous in (("decode", "mixed"), ("mixed", "decode")):
            reply = stub.SetRole(pb.SetRoleRequest(role=role), timeout=60)
            assert (reply.role, reply.previous) == (role, previous)
    after = worker.load()
    assert after.role == "mixed" and not (after.reserved or after.running or after.waiting)

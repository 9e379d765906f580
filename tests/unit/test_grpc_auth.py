"""Worker gRPC authorization (:mod:`proto.grpc_auth`): token parsing, the identity/verb
table, the constant-time comparison, router tokens addressed to one worker, and both
interceptors end to end on in-process servers (recording stand-ins for the worker's
servicer, on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pytest
from grpc_health.v1 import _async as health_aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from proto import channels, grpc_auth, grpc_client_auth, worker_pb2_grpc
from proto import worker_pb2 as pb
from proto.credentials import Credentials, NotGrantedError, token_digest
from proto.grants import grant
from proto.grpc_auth import MONITOR, ROUTER, Authenticator, parse
from proto.registry import ClusterConfig
from proto.trust import grpc_token, new_secret

SECRET = new_secret()
FULL = Credentials.of(SECRET)
WORKER_GRANT = Credentials.of(grant(SECRET, "worker"))
ADDRESS = "10.0.0.5:50051"
"""The address the worker under test advertises (router tokens must be addressed to it)."""
WORKER = "/kvserve.worker.v1.Worker/"
HEALTH = {f"/grpc.health.v1.Health/{v}" for v in ("Check", "Watch", "List")}
VERBS = ("Reserve", "Prefill", "Generate", "Abort", "GetLoad", "SetRole")
UNAUTHENTICATED, DENIED = grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED


def bearer(secret: str, identity: str, audience: str = ADDRESS) -> list[tuple[str, str]]:
    """The metadata a holder of ``secret`` sends as ``identity`` to the worker at
    ``audience`` (the router's token is signed for it; another identity's is its bearer
    token)."""
    if identity == ROUTER:
        return [("authorization", f"Bearer {Credentials.of(secret).signer().token(audience)}")]
    return [("authorization", f"Bearer {grpc_token(secret, identity)}")]


OLD_ROUTER_BEARER = [("authorization", f"Bearer {grpc_token(SECRET, ROUTER)}")]
"""The router's token before it was signed per worker: a bearer token (now refused)."""


def authenticator(credentials: Credentials) -> Authenticator:
    return Authenticator(credentials, lambda: ADDRESS)


# -- parsing and the table ---------------------------------------------------------------


def test_parse_takes_bearer_identity_dot_rest_only() -> None:
    token = grpc_token(SECRET, MONITOR)
    assert parse(f"Bearer {token}") == (MONITOR, token)
    assert parse(f"bearer  {token} ".encode()) == (MONITOR, token)  # scheme case, bytes
    signed = bearer(SECRET, ROUTER)[0][1]
    assert parse(signed) == (ROUTER, signed.split(" ")[1])
    for bad in ("", token, f"Basic {token}", "Bearer", "Bearer nodot", "Bearer .abc",
                "Bearer router.", "Bearer rout\u00e9r.abc"):  # fmt: skip
        assert parse(bad) is None, bad


def test_header_round_trips_and_unknown_identities_are_refused() -> None:
    key, value = grpc_auth.header(FULL, MONITOR, ADDRESS)()
    assert key == "authorization" and parse(value) == (MONITOR, grpc_token(SECRET, MONITOR))
    signed = grpc_auth.header(FULL, ROUTER, ADDRESS)()  # minted now: checked, not compared
    assert signed[0] == "authorization" and parse(signed[1]) is not None
    assert authenticator(WORKER_GRANT).refusal(WORKER + "SetRole", [signed]) is None
    with pytest.raises(ValueError, match="unknown gRPC identity"):
        grpc_auth.header(FULL, "prefill", ADDRESS)
    with pytest.raises(ValueError, match="unknown gRPC identity"):
        channels.sync_channel("127.0.0.1:1", ClusterConfig(), identity="admin")


def test_router_may_call_every_verb_and_monitor_only_observes() -> None:
    assert set(grpc_auth.PERMISSIONS) == {ROUTER, MONITOR}
    assert grpc_auth.PERMISSIONS[ROUTER] == {WORKER + v for v in VERBS} | HEALTH
    assert grpc_auth.PERMISSIONS[MONITOR] == {WORKER + "GetLoad"} | HEALTH
    # every verb the proto defines is in the table (a new one is the router's alone)
    assert set(grpc_auth.WORKER_METHODS) == {WORKER + v for v in VERBS}


@pytest.mark.parametrize(
    ("metadata", "method", "code"),  # metadata made when the test runs: tokens expire
    [
        (lambda: [], WORKER + "GetLoad", UNAUTHENTICATED),
        (lambda: [("authorization", "")], WORKER + "GetLoad", UNAUTHENTICATED),
        (lambda: bearer(new_secret(), ROUTER), WORKER + "SetRole", UNAUTHENTICATED),  # wrong secret
        (
            lambda: bearer(SECRET, ROUTER, "10.0.0.6:50051"),
            WORKER + "Abort",
            UNAUTHENTICATED,
        ),  # replay
        (lambda: OLD_ROUTER_BEARER, WORKER + "Abort", UNAUTHENTICATED),
        (lambda: bearer(SECRET, "admin"), WORKER + "SetRole", UNAUTHENTICATED),  # unknown identity
        (
            lambda: [("authorization", f"Bearer router.{'0' * 64}")],
            WORKER + "Abort",
            UNAUTHENTICATED,
        ),
        (lambda: bearer(SECRET, ROUTER) * 2, WORKER + "Abort", UNAUTHENTICATED),  # two entries
        (lambda: bearer(SECRET, MONITOR), WORKER + "SetRole", DENIED),
        (lambda: bearer(SECRET, MONITOR), WORKER + "Reserve", DENIED),
        (lambda: bearer(SECRET, ROUTER), "/grpc.reflection.v1.ServerReflection/Info", DENIED),
        (lambda: bearer(SECRET, MONITOR), WORKER + "GetLoad", None),
        (lambda: bearer(SECRET, MONITOR), "/grpc.health.v1.Health/Check", None),
        (lambda: bearer(SECRET, ROUTER), WORKER + "SetRole", None),
    ],
)
def test_refusals(
    metadata: Callable[[], list[tuple[str, str]]], method: str, code: grpc.StatusCode | None
) -> None:
    for credentials in (FULL, WORKER_GRANT):  # a worker's grant verifies exactly the same
        refusal = authenticator(credentials).refusal(method, metadata())
        assert (refusal.code if refusal else None) == code


def test_a_worker_grant_cannot_make_the_routers_token() -> None:
    """What a broken-into worker holds: the monitor token and verifiers, never a token that
    SetRole / Abort / Reserve would accept."""
    assert WORKER_GRANT.token(MONITOR) == grpc_token(SECRET, MONITOR)
    with pytest.raises(NotGrantedError, match="router-sign"):
        WORKER_GRANT.signer()
    with pytest.raises(NotGrantedError, match="router-sign"):
        grpc_client_auth.aio_interceptors(WORKER_GRANT, ROUTER, ADDRESS)
    assert WORKER_GRANT.verifier(ROUTER) == FULL.verifier(ROUTER)  # the public key
    router = Credentials.of(grant(SECRET, "router"))
    assert router.signer().token(ADDRESS).startswith("router.")
    with pytest.raises(ValueError, match="a cluster secret or a grant"):
        authenticator(Credentials.of(""))
    # the router's grant accepts no caller (it serves no gRPC): every token is refused
    refusal = authenticator(router).refusal(WORKER + "GetLoad", bearer(SECRET, ROUTER))
    assert refusal is not None and refusal.code == UNAUTHENTICATED


def test_a_refused_router_token_says_why() -> None:
    refusal = authenticator(WORKER_GRANT).refusal(
        WORKER + "Abort", bearer(SECRET, ROUTER, "10.0.0.6:50051")
    )
    assert refusal is not None and "addressed to '10.0.0.6:50051'" in refusal.details


def test_the_verdict_is_a_constant_time_compare_against_the_named_identity(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[tuple[bytes, bytes]] = []
    verdict = [True]

    def spy(a: bytes, b: bytes) -> bool:
        seen.append((a, b))
        return verdict[0]

    monkeypatch.setattr(hmac, "compare_digest", spy)
    auth = authenticator(WORKER_GRANT)
    forged = f"monitor.{'f' * 64}"
    assert auth.identity([("authorization", f"Bearer {forged}")]) == (MONITOR, "")  # spy: yes
    assert seen == [(token_digest(forged), token_digest(grpc_token(SECRET, MONITOR)))]
    verdict[0] = False
    assert auth.identity(bearer(SECRET, MONITOR))[0] is None  # the spy says no to a real one


def test_without_a_secret_nothing_is_installed() -> None:
    none = Credentials.of("")
    assert grpc_auth.server_interceptors(none, lambda: ADDRESS) == []
    assert grpc_client_auth.aio_interceptors(none, ROUTER, ADDRESS) == []
    assert grpc_client_auth.sync_interceptors(none, MONITOR, ADDRESS) == []


def test_a_callers_own_authorization_is_replaced() -> None:
    entry = grpc_auth.header(FULL, ROUTER, ADDRESS)()
    merged = grpc_client_auth.with_header(
        [("authorization", "Bearer x.y"), ("x-trace", "1")], entry
    )
    assert merged == [("x-trace", "1"), entry]


# -- both interceptors on a real in-process server -----------------------------------------


class Recorder(worker_pb2_grpc.WorkerServicer):
    """Records the verbs that reached it."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def GetLoad(self, request: pb.LoadRequest, context: Any) -> pb.LoadReport:  # noqa: N802
        self.calls.append("GetLoad")
        return pb.LoadReport(role="mixed")

    async def SetRole(self, request: pb.SetRoleRequest, context: Any) -> pb.SetRoleReply:  # noqa: N802
        self.calls.append("SetRole")
        return pb.SetRoleReply(role=request.role, previous="mixed")

    async def Generate(  # noqa: N802
        self, request: pb.GenerateRequest, context: Any
    ) -> AsyncIterator[pb.TokenChunk]:
        self.calls.append("Generate")
        yield pb.TokenChunk(token_ids=[7], finish_reason=pb.FINISH_REASON_LENGTH)


@asynccontextmanager
async def serving(cluster: ClusterConfig) -> AsyncIterator[tuple[str, Recorder]]:
    bound: list[str] = []
    server = channels.server(cluster, lambda: bound[0])
    recorder = Recorder()  # type: ignore[abstract]  # the verbs it lacks answer UNIMPLEMENTED
    worker_pb2_grpc.add_WorkerServicer_to_server(recorder, server)
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    bound.append(f"127.0.0.1:{channels.add_port(server, '127.0.0.1:0', cluster)}")
    await server.start()
    try:
        yield bound[0], recorder
    finally:
        await server.stop(None)


def sync_code(call: Callable[[], Any]) -> grpc.StatusCode:
    try:
        call()
    except grpc.RpcError as exc:
        code: grpc.StatusCode = exc.code()
        return code
    return grpc.StatusCode.OK


async def aio_code(call: Callable[[], Any]) -> grpc.StatusCode:
    try:
        await call()
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def generate() -> pb.GenerateRequest:
    return pb.GenerateRequest(request_id="r", prompt_token_ids=[1])


def test_channels_carry_their_identity_and_the_server_enforces_it() -> None:
    cluster = ClusterConfig(cluster_secret=SECRET)
    stranger = ClusterConfig(cluster_secret=new_secret())

    def blocking(address: str) -> dict[str, grpc.StatusCode]:
        check = health_pb2.HealthCheckRequest()
        codes = {}
        with channels.sync_channel(address, cluster) as monitor:  # default: monitor
            codes["monitor GetLoad"] = sync_code(
                lambda: worker_pb2_grpc.WorkerStub(monitor).GetLoad(pb.LoadRequest(), timeout=10)
            )
            codes["monitor SetRole"] = sync_code(
                lambda: worker_pb2_grpc.WorkerStub(monitor).SetRole(
                    pb.SetRoleRequest(role="decode"), timeout=10
                )
            )
            codes["monitor health"] = sync_code(
                lambda: health_pb2_grpc.HealthStub(monitor).Check(check, timeout=10)
            )
        with grpc.insecure_channel(address) as bare:
            codes["bare health"] = sync_code(
                lambda: health_pb2_grpc.HealthStub(bare).Check(check, timeout=10)
            )
            codes["bare Generate"] = sync_code(
                lambda: list(worker_pb2_grpc.WorkerStub(bare).Generate(generate(), timeout=10))
            )
            elsewhere = tuple(bearer(SECRET, ROUTER, "127.0.0.1:1"))  # another worker got it
            codes["replayed Generate"] = sync_code(
                lambda: list(
                    worker_pb2_grpc.WorkerStub(bare).Generate(
                        generate(), timeout=10, metadata=elsewhere
                    )
                )
            )
        with channels.sync_channel(address, cluster, identity=ROUTER) as router:
            codes["router sync Generate"] = sync_code(
                lambda: list(worker_pb2_grpc.WorkerStub(router).Generate(generate(), timeout=10))
            )
        with channels.sync_channel(address, stranger, identity=ROUTER) as other:
            codes["stranger SetRole"] = sync_code(
                lambda: worker_pb2_grpc.WorkerStub(other).SetRole(
                    pb.SetRoleRequest(role="decode"), timeout=10
                )
            )
        return codes

    async def scenario() -> tuple[dict[str, grpc.StatusCode], list[str]]:
        async with serving(cluster) as (address, recorder):
            codes = await asyncio.to_thread(blocking, address)
            async with channels.channel(address, cluster) as router:  # default: router
                stub = worker_pb2_grpc.WorkerStub(router)

                async def stream() -> None:
                    assert [c.token_ids[0] async for c in stub.Generate(generate(), timeout=10)]

                codes["router Generate"] = await aio_code(stream)
                codes["router SetRole"] = await aio_code(
                    lambda: stub.SetRole(pb.SetRoleRequest(role="decode"), timeout=10)
                )
            async with channels.channel(address, stranger) as other:
                codes["stranger stream"] = await aio_code(
                    lambda: worker_pb2_grpc.WorkerStub(other).Generate(generate()).read()
                )
            return codes, recorder.calls

    codes, calls = asyncio.run(scenario())
    assert codes == {
        "monitor GetLoad": grpc.StatusCode.OK,
        "monitor SetRole": DENIED,
        "monitor health": grpc.StatusCode.OK,
        "bare health": UNAUTHENTICATED,
        "bare Generate": UNAUTHENTICATED,
        "replayed Generate": UNAUTHENTICATED,
        "stranger SetRole": UNAUTHENTICATED,
        "router sync Generate": grpc.StatusCode.OK,
        "router Generate": grpc.StatusCode.OK,
        "router SetRole": grpc.StatusCode.OK,
        "stranger stream": UNAUTHENTICATED,
    }
    assert calls == ["GetLoad", "Generate", "Generate", "SetRole"]  # refused calls never reached it

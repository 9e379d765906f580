"""Who may call which method of a worker's gRPC server: bearer tokens from the cluster secret.

Identities (:data:`PERMISSIONS`), each with the token :func:`proto.trust.grpc_token` derives
for it from the cluster secret (a process holding a grant instead presents and accepts only
the tokens its grant holds: :mod:`proto.credentials`, :mod:`proto.grants`):

- ``router`` (:data:`ROUTER`): every ``Worker`` verb (Reserve, Prefill, Generate, Abort,
  GetLoad, SetRole; a verb added to ``worker.proto`` later is the router's alone until
  granted to another identity) and the health service;
- ``monitor`` (:data:`MONITOR`): ``GetLoad`` and the health service only: health checks
  (``kvserve probe``, the launcher's readiness wait), fault tests and tools that observe.

Nothing is open: with a secret, the standard ``grpc.health.v1.Health`` service (Check,
Watch, List) needs a token too (``monitor`` or ``router``), so an outsider learns not even
whether a worker is serving and cannot hold Watch streams open. Probes that cannot send
metadata (a bare ``grpc_health_probe``, Kubernetes' built-in gRPC probe) must therefore
run ``kvserve probe worker``, which reads the secret (or a grant) from
``KVSERVE_CLUSTER_SECRET``.

On the wire, every call carries one metadata entry ``authorization: Bearer <token>``, the
token being ``<identity>.<hex>``. A worker with a secret (:class:`ServerAuth`) answers:

- ``UNAUTHENTICATED`` when the entry is missing, repeated, malformed, names no identity, or
  its token is not that identity's (its SHA-256 compared with :func:`hmac.compare_digest`,
  in constant time, against the verifier the worker holds for the named identity);
- ``PERMISSION_DENIED`` when a valid identity calls a method it is not granted (unknown
  methods included: deny by default);

and runs the method otherwise. A refused call never reaches the servicer: its request is
not even parsed. With an empty secret there are no checks at all (:func:`server_interceptors`
returns none; :mod:`proto.channels` logs that once when the server is built).

Client side, :mod:`proto.grpc_client_auth` adds the entry to every call of a channel. The token
authorizes the verb; it is no transport security: across an untrusted network run TLS as well
(:mod:`proto.channels`), or a sniffed token is as good as the secret for its verbs.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.descriptor import ServiceDescriptor
from grpc_health.v1 import health_pb2

from proto import worker_pb2
from proto.credentials import Credentials, token_matches
from proto.refusals import Rejection, RejectLog

log = logging.getLogger(__name__)

AUTHORIZATION = "authorization"
"""The metadata key that carries the token (gRPC metadata keys are lower case)."""
SCHEME = "Bearer"
ROUTER = "router"
MONITOR = "monitor"


Metadata = Iterable[tuple[str, str | bytes]]
"""Call metadata as gRPC hands it over: ``(key, value)`` pairs."""


def _methods(service: ServiceDescriptor) -> tuple[str, ...]:
    """Full method paths (``/package.Service/Verb``) of a service."""
    return tuple(f"/{service.full_name}/{m.name}" for m in service.methods)


_WORKER = worker_pb2.DESCRIPTOR.services_by_name["Worker"]
WORKER_METHODS = _methods(_WORKER)
HEALTH_METHODS = _methods(health_pb2.DESCRIPTOR.services_by_name["Health"])
GET_LOAD = f"/{_WORKER.full_name}/GetLoad"

PERMISSIONS: Mapping[str, frozenset[str]] = {
    ROUTER: frozenset((*WORKER_METHODS, *HEALTH_METHODS)),
    MONITOR: frozenset((GET_LOAD, *HEALTH_METHODS)),
}
"""Identity -> the full method paths it may call (anything else: PERMISSION_DENIED)."""


def check_identity(identity: str) -> str:
    """``identity`` if it is one of :data:`PERMISSIONS`, else ValueError."""
    if identity not in PERMISSIONS:
        raise ValueError(f"unknown gRPC identity {identity!r}; use one of {sorted(PERMISSIONS)}")
    return identity


def header(credentials: Credentials, identity: str) -> tuple[str, str]:
    """The metadata entry ``identity`` sends (:class:`~proto.credentials.NotGrantedError` when
    ``credentials`` hold no token of it)."""
    return AUTHORIZATION, f"{SCHEME} {credentials.token(check_identity(identity))}"


def parse(value: str | bytes) -> tuple[str, str] | None:
    """``(identity, token)`` from an authorization value ``Bearer <identity>.<hex>`` (the
    scheme is case-insensitive), or None when the value has another shape. The identity is
    only what the token claims: nothing is verified here."""
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    scheme, _, token = value.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != SCHEME.lower() or not token.isascii():
        return None
    identity, dot, digest = token.rpartition(".")
    if not (identity and dot and digest):
        return None
    return identity, token


@dataclass(frozen=True)
class Refusal:
    """Why a call is refused: the status and the details it is answered with."""

    code: grpc.StatusCode
    details: str


class Authenticator:
    """Decides, from a call's method and metadata, whether a worker runs it (see the module
    docstring) with the verifiers ``credentials`` hold (an identity without one is refused),
    worked out once here rather than on every call."""

    def __init__(self, credentials: Credentials) -> None:
        if not credentials.secured:
            raise ValueError("an Authenticator needs a cluster secret or a grant")
        self._verifiers = {i: credentials.verifier(i) for i in PERMISSIONS}

    def identity(self, metadata: Metadata | None) -> str | None:
        """The identity whose valid token ``metadata`` carries, or None (no, several, or a
        malformed or wrong authorization entry)."""
        values = [v for k, v in (metadata or ()) if k.lower() == AUTHORIZATION]
        if len(values) != 1 or (parsed := parse(values[0])) is None:
            return None
        identity, token = parsed
        return identity if token_matches(self._verifiers.get(identity), token) else None

    def refusal(self, method: str, metadata: Metadata | None) -> Refusal | None:
        """None when the call may run, else how it is answered."""
        identity = self.identity(metadata)
        if identity is None:
            return Refusal(
                grpc.StatusCode.UNAUTHENTICATED,
                "missing or invalid token: worker gRPC needs 'authorization: Bearer <token>' "
                "derived from the cluster secret (KVSERVE_CLUSTER_SECRET)",
            )
        if method not in PERMISSIONS[identity]:
            return Refusal(grpc.StatusCode.PERMISSION_DENIED, f"{identity} may not call {method}")
        return None


_HANDLERS: Mapping[tuple[bool, bool], Callable[..., grpc.RpcMethodHandler[Any, Any]]] = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


_REFUSALS = RejectLog(log, "gRPC call")
"""Refused calls, logged per (method, status) at most once a minute: a flood of bad calls
does not flood the log."""


def _refusing(
    handler: grpc.RpcMethodHandler[Any, Any] | None, method: str, refusal: Refusal
) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler of the same streaming kind as ``handler`` (unary for an unknown method)
    that answers ``refusal`` without parsing the request."""

    async def refuse(_request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        _REFUSALS.note([Rejection(method, refusal.code.name, f"from {context.peer()}")])
        await context.abort(refusal.code, refusal.details)

    kind = (False, False)
    if handler is not None:
        kind = (bool(handler.request_streaming), bool(handler.response_streaming))
    return _HANDLERS[kind](refuse)


class ServerAuth(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """The server interceptor of a worker with a secret: runs a call only when
    :meth:`Authenticator.refusal` finds nothing against it."""

    def __init__(self, credentials: Credentials) -> None:
        self.authenticator = Authenticator(credentials)

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        method = handler_call_details.method
        refusal = self.authenticator.refusal(method, handler_call_details.invocation_metadata)
        handler = await continuation(handler_call_details)
        return handler if refusal is None else _refusing(handler, method, refusal)


def server_interceptors(
    credentials: Credentials,
) -> list[grpc.aio.ServerInterceptor]:  # type: ignore[type-arg]
    """The interceptors of a worker's server: :class:`ServerAuth`, or none without a secret."""
    return [ServerAuth(credentials)] if credentials.secured else []

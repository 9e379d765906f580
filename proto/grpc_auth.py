"""Who may call which method of a worker's gRPC server: signed router tokens, bearer tokens.

Identities (:data:`PERMISSIONS`):

- ``router`` (:data:`ROUTER`): every ``Worker`` verb (Reserve, Prefill, Generate, Abort,
  GetLoad, SetRole; a verb added to ``worker.proto`` later is the router's alone until
  granted to another identity) and the health service. Its token is signed for one worker
  and lives seconds (:mod:`proto.call_tokens`): a worker that receives it can replay it
  nowhere else;
- ``monitor`` (:data:`MONITOR`): ``GetLoad`` and the health service only: health checks
  (``kvserve probe``, the launcher's readiness wait), fault tests and tools that observe.
  Its token is a bearer token (:func:`proto.trust.grpc_token`): what it grants is harmless
  to replay.

Which process holds what (a secret, or a grant that holds less): :mod:`proto.credentials`,
:mod:`proto.grants`.

Nothing is open: with a secret, the standard ``grpc.health.v1.Health`` service (Check,
Watch, List) needs a token too (``monitor`` or ``router``), so an outsider learns not even
whether a worker is serving and cannot hold Watch streams open. Probes that cannot send
metadata (a bare ``grpc_health_probe``, Kubernetes' built-in gRPC probe) must therefore
run ``kvserve probe worker``, which reads the secret (or a grant) from
``KVSERVE_CLUSTER_SECRET``.

On the wire, every call carries one metadata entry ``authorization: Bearer <token>``, the
token starting with its identity and a dot. A worker with a secret (:class:`ServerAuth`)
answers:

- ``UNAUTHENTICATED`` when the entry is missing, repeated, malformed, names no identity, or
  its token is not that identity's: a router token that does not check (signature, expiry,
  addressed to another worker: the details say which), a bearer token whose SHA-256 differs
  from the verifier the worker holds (compared with :func:`hmac.compare_digest`);
- ``PERMISSION_DENIED`` when a valid identity calls a method it is not granted (unknown
  methods included: deny by default);

and runs the method otherwise. A refused call never reaches the servicer: its request is
not even parsed. With an empty secret there are no checks at all (:func:`server_interceptors`
returns none; :mod:`proto.channels` logs that once when the server is built).

Client side, :mod:`proto.grpc_client_auth` adds the entry to every call of a channel. The token
authorizes the verb; it is no transport security: across an untrusted network run TLS as well
(:mod:`proto.channels`), or a sniffed token is as good as its identity's for its verbs (a
router token: at that worker, until it expires).
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
from proto.call_tokens import Verifier
from proto.credentials import Credentials, token_matches
from proto.refusals import Rejection, RejectLog
from proto.trust import MONITOR, ROUTER

log = logging.getLogger(__name__)

AUTHORIZATION = "authorization"
"""The metadata key that carries the token (gRPC metadata keys are lower case)."""
SCHEME = "Bearer"
__all__ = ["MONITOR", "ROUTER"]  # re-exported: callers name identities from here


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


Entry = Callable[[], tuple[str, str]]
"""Makes the metadata entry of one call (a router token is re-minted as it ages)."""


def header(credentials: Credentials, identity: str, audience: str) -> Entry:
    """What makes the metadata entry ``identity`` sends to the worker at ``audience``
    (``host:port``) (:class:`~proto.credentials.NotGrantedError` when ``credentials`` can
    make no token of it)."""
    if check_identity(identity) == ROUTER:
        signer = credentials.signer()
        return lambda: (AUTHORIZATION, f"{SCHEME} {signer.token(audience)}")
    entry = (AUTHORIZATION, f"{SCHEME} {credentials.token(identity)}")
    return lambda: entry


def parse(value: str | bytes) -> tuple[str, str] | None:
    """``(identity, token)`` from an authorization value ``Bearer <identity>.<rest>`` (the
    scheme is case-insensitive), or None when the value has another shape. The identity is
    only what the token claims: nothing is verified here."""
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    scheme, _, token = value.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != SCHEME.lower() or not token.isascii():
        return None
    identity, dot, rest = token.partition(".")
    if not (identity and dot and rest):
        return None
    return identity, token


@dataclass(frozen=True)
class Refusal:
    """Why a call is refused: the status and the details it is answered with."""

    code: grpc.StatusCode
    details: str


_INVALID = (
    "missing or invalid token: worker gRPC needs 'authorization: Bearer <token>' "
    "derived from the cluster secret (KVSERVE_CLUSTER_SECRET)"
)


class Authenticator:
    """Decides, from a call's method and metadata, whether the worker at ``audience`` (its
    advertised ``host:port``, read when a router token is checked) runs it (see the module
    docstring), with the verifiers ``credentials`` hold (an identity without one is
    refused), worked out once here rather than on every call."""

    def __init__(self, credentials: Credentials, audience: Callable[[], str]) -> None:
        if not credentials.secured:
            raise ValueError("an Authenticator needs a cluster secret or a grant")
        public = credentials.verifier(ROUTER)
        self._router = None if public is None else Verifier(public, audience)
        self._digests = {i: credentials.verifier(i) for i in PERMISSIONS if i != ROUTER}

    def identity(self, metadata: Metadata | None) -> tuple[str | None, str]:
        """``(identity, "")`` when ``metadata`` carries a valid token of that identity, else
        ``(None, why)`` (no, several, or a malformed or wrong authorization entry)."""
        values = [v for k, v in (metadata or ()) if k.lower() == AUTHORIZATION]
        if len(values) != 1 or (parsed := parse(values[0])) is None:
            return None, _INVALID
        identity, token = parsed
        if identity == ROUTER:
            why = self._router.why_not(token) if self._router else "this worker accepts no router"
            return (None, f"{_INVALID}: {why}") if why else (ROUTER, "")
        if token_matches(self._digests.get(identity), token):
            return identity, ""
        return None, _INVALID

    def refusal(self, method: str, metadata: Metadata | None) -> Refusal | None:
        """None when the call may run, else how it is answered."""
        identity, why = self.identity(metadata)
        if identity is None:
            return Refusal(grpc.StatusCode.UNAUTHENTICATED, why)
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

    def __init__(self, credentials: Credentials, audience: Callable[[], str]) -> None:
        self.authenticator = Authenticator(credentials, audience)

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
    credentials: Credentials, audience: Callable[[], str]
) -> list[grpc.aio.ServerInterceptor]:  # type: ignore[type-arg]
    """The interceptors of the server of the worker at ``audience``: :class:`ServerAuth`, or
    none without a secret."""
    return [ServerAuth(credentials, audience)] if credentials.secured else []

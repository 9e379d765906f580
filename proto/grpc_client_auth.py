"""The client side of :mod:`proto.grpc_auth`: the interceptors that add an identity's
``authorization: Bearer <token>`` entry to every call of a channel (asyncio or blocking):
the router's token signed for the worker the channel dials, re-minted as it ages
(:mod:`proto.call_tokens`), or a bearer identity's fixed token.
gRPC refuses call credentials on a plaintext channel, so this is done with interceptors,
which work the same with and without TLS."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import grpc

from proto.credentials import Credentials
from proto.grpc_auth import AUTHORIZATION, Entry, Metadata, check_identity, header


def with_header(metadata: Metadata | None, entry: tuple[str, str]) -> list[tuple[str, Any]]:
    """``metadata`` with ``entry`` as its only authorization entry (one a caller set is
    replaced, so a call never carries two)."""
    kept = [(k, v) for k, v in (metadata or ()) if k.lower() != AUTHORIZATION]
    return [*kept, entry]


class _AioToken:
    """Adds the token to the calls of an asyncio channel: one subclass per call kind, since
    an asyncio channel files an interceptor under the first kind it implements only."""

    def __init__(self, entry: Entry) -> None:
        self._entry = entry

    def _details(self, d: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*with_header(d.metadata, self._entry()))
        return grpc.aio.ClientCallDetails(
            d.method, d.timeout, metadata, d.credentials, d.wait_for_ready
        )


class _AioUnaryUnary(_AioToken, grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[type-arg]
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


class _AioUnaryStream(_AioToken, grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[type-arg]
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


class _AioStreamUnary(_AioToken, grpc.aio.StreamUnaryClientInterceptor):  # type: ignore[type-arg]
    async def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(self._details(details), requests)


class _AioStreamStream(_AioToken, grpc.aio.StreamStreamClientInterceptor):  # type: ignore[type-arg]
    async def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(self._details(details), requests)


_AIO_KINDS = (_AioUnaryUnary, _AioUnaryStream, _AioStreamUnary, _AioStreamStream)


@dataclass(frozen=True)
class _CallDetails(grpc.ClientCallDetails):
    method: str
    timeout: float | None
    metadata: Any
    credentials: grpc.CallCredentials | None
    wait_for_ready: bool | None
    compression: grpc.Compression | None


class _SyncToken(
    grpc.UnaryUnaryClientInterceptor,  # type: ignore[type-arg]
    grpc.UnaryStreamClientInterceptor,  # type: ignore[type-arg]
    grpc.StreamUnaryClientInterceptor,  # type: ignore[type-arg]
    grpc.StreamStreamClientInterceptor,  # type: ignore[type-arg]
):
    """Adds the token to every call of a blocking channel (:func:`grpc.intercept_channel`)."""

    def __init__(self, entry: Entry) -> None:
        self._entry = entry

    def _details(self, d: grpc.ClientCallDetails) -> _CallDetails:
        metadata = with_header(d.metadata, self._entry())
        wait = getattr(d, "wait_for_ready", None)
        compression = getattr(d, "compression", None)
        return _CallDetails(d.method, d.timeout, metadata, d.credentials, wait, compression)

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)


def aio_interceptors(credentials: Credentials, identity: str, audience: str) -> list[Any]:
    """Client interceptors of an asyncio channel to the worker at ``audience`` (the
    ``host:port`` dialed) calling as ``identity`` (none without a secret: the worker checks
    nothing then). ValueError for an unknown identity,
    :class:`~proto.credentials.NotGrantedError` for one whose token ``credentials`` cannot
    make."""
    check_identity(identity)
    if not credentials.secured:
        return []
    entry = header(credentials, identity, audience)
    return [kind(entry) for kind in _AIO_KINDS]


def sync_interceptors(credentials: Credentials, identity: str, audience: str) -> list[Any]:
    """The same for a blocking channel (for :func:`grpc.intercept_channel`)."""
    check_identity(identity)
    if not credentials.secured:
        return []
    return [_SyncToken(header(credentials, identity, audience))]

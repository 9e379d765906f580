"""gRPC channels and servers of a cluster, built in one place: keepalive, TLS, tokens.

Every process that speaks gRPC to a worker (the router's view, the launcher's health
checks) dials through :func:`channel` / :func:`sync_channel`, and a worker serves through
:func:`server` + :func:`add_port`, so both ends agree on three things:

1. **Peer liveness.** A frozen peer (stopped, swapping, its host gone) may still have a
   kernel that ACKs TCP, so TCP alone never notices; an HTTP/2 PING does. Each end pings
   every ``peer_timeout_s / 2`` (with or without calls in flight) and closes the
   connection when a ping is not acknowledged within another ``peer_timeout_s / 2``: every
   call on it then fails with UNAVAILABLE, within about ``peer_timeout_s``, instead of
   waiting for its own deadline. The server accepts pings as often as every
   ``peer_timeout_s / 4`` (a client whose setting is up to twice as eager still fits)
   and does not count them against the client, so it never answers them with GOAWAY.
2. **Transport security** (:attr:`ClusterConfig.grpc_tls`): with ``grpc_tls_cert`` and
   ``grpc_tls_key`` a worker serves TLS, and with ``grpc_tls_ca`` it also requires a
   client certificate signed by that CA (mutual TLS). A client verifies the worker with
   ``grpc_tls_ca`` (the system's roots when empty) and presents its own certificate when
   it has one. Worker certificates must name the address workers advertise (a SAN such as
   ``IP:127.0.0.1`` or the host name).
3. **Who may call what** (:mod:`proto.grpc_auth`): with a
   :attr:`~ClusterConfig.cluster_secret`, every call carries ``authorization: Bearer
   <token>``, the token of the identity the channel was opened as (:func:`channel`:
   ``router`` by default, every verb, a token signed for the address dialed;
   :func:`sync_channel`: ``monitor`` by default, ``GetLoad`` and health only), and the
   worker's server refuses a call without a valid token (UNAUTHENTICATED: a router token
   must be addressed to the address the worker advertises, :func:`server`'s ``audience``)
   or outside its identity's verbs (PERMISSION_DENIED). Without a secret nothing is
   checked, and :func:`server` logs that the worker's gRPC is unauthenticated.

TLS and the token do different jobs: (mutual) TLS authenticates and encrypts the channel,
the token authorizes each verb (any certificate the CA signed is still only a transport: a
worker's certificate makes no router). A token on plaintext can be sniffed and replayed by
anyone on the path (a router token: at its worker, for seconds), so across networks you do
not trust, run TLS too; plaintext with tokens is for loopback or a private network.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from proto.grpc_auth import MONITOR, ROUTER, server_interceptors
from proto.grpc_client_auth import aio_interceptors, sync_interceptors
from proto.registry import ClusterConfig

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 64 << 20


def keepalive_ms(cluster: ClusterConfig) -> int:
    """Ping interval, and also the time a ping may go unanswered: half the peer timeout."""
    return max(50, int(cluster.peer_timeout_s * 500))


def _common_options(cluster: ClusterConfig) -> list[tuple[str, Any]]:
    half = keepalive_ms(cluster)
    return [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.keepalive_time_ms", half),
        ("grpc.keepalive_timeout_ms", half),
        # This gRPC core waits for every ping, keepalive ones included, for
        # ping_timeout_ms (default 60 s) whatever keepalive_timeout_ms says: bound it too.
        ("grpc.http2.ping_timeout_ms", half),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),  # keepalive pings never run out
    ]


RECONNECT_BACKOFF_MS = (100, 1000)
"""First and longest wait before redialing a worker that went away: a restarted worker
(same address) is called again within a second, not after gRPC's default of up to 2 min."""


def connect_timeout_ms(cluster: ClusterConfig) -> int:
    """How long one connection attempt may take (TCP, then the peer's HTTP/2 settings): the
    peer timeout, never less than a redial's backoff. gRPC takes it from
    ``grpc.min_reconnect_backoff_ms`` (its MIN_CONNECT_TIMEOUT, 20 s by default): set to the
    backoff's 100 ms, a worker busy for more than a second at the moment it was dialled was
    taken for an unreachable one."""
    return max(RECONNECT_BACKOFF_MS[1], int(cluster.peer_timeout_s * 1000))


def channel_options(cluster: ClusterConfig) -> list[tuple[str, Any]]:
    """Options of every client channel to a worker: redial a worker that went away within
    :data:`RECONNECT_BACKOFF_MS`, give each attempt :func:`connect_timeout_ms`."""
    first, longest = RECONNECT_BACKOFF_MS
    return [
        *_common_options(cluster),
        ("grpc.initial_reconnect_backoff_ms", first),
        ("grpc.min_reconnect_backoff_ms", connect_timeout_ms(cluster)),
        ("grpc.max_reconnect_backoff_ms", longest),
        # Subchannels are shared by every channel of the process to the same address unless
        # this is set: a new channel to a restarted worker would inherit the old channel's
        # connection backoff and fail every call for up to a second.
        ("grpc.use_local_subchannel_pool", 1),
    ]


def server_options(cluster: ClusterConfig) -> list[tuple[str, Any]]:
    """Options of a worker's gRPC server (it pings its clients too, so a frozen router's
    streams are cancelled and their requests aborted)."""
    return [
        *_common_options(cluster),
        ("grpc.http2.min_ping_interval_without_data_ms", max(10, keepalive_ms(cluster) // 2)),
        ("grpc.http2.max_ping_strikes", 0),  # 0: pings never earn a GOAWAY
    ]


def _read(path: str) -> bytes | None:
    return Path(path).read_bytes() if path else None


def channel_credentials(cluster: ClusterConfig) -> grpc.ChannelCredentials | None:
    """TLS credentials of a client, or None for plaintext."""
    if not cluster.grpc_tls:
        return None
    return grpc.ssl_channel_credentials(
        root_certificates=_read(cluster.grpc_tls_ca),
        private_key=_read(cluster.grpc_tls_key),
        certificate_chain=_read(cluster.grpc_tls_cert),
    )


def server_credentials(cluster: ClusterConfig) -> grpc.ServerCredentials | None:
    """TLS credentials of a worker's server (client certificates required when a CA is
    set), or None for plaintext; raises ValueError when TLS is asked for without a
    certificate to serve."""
    if not cluster.grpc_tls:
        return None
    key, cert = _read(cluster.grpc_tls_key), _read(cluster.grpc_tls_cert)
    if key is None or cert is None:
        raise ValueError(
            "a worker serving TLS needs its own certificate: set grpc_tls_cert and "
            "grpc_tls_key (KVSERVE_GRPC_TLS_CERT, KVSERVE_GRPC_TLS_KEY), or clear grpc_tls_ca "
            "for plaintext"
        )
    ca = _read(cluster.grpc_tls_ca)
    return grpc.ssl_server_credentials([(key, cert)], ca, require_client_auth=ca is not None)


def channel(address: str, cluster: ClusterConfig, identity: str = ROUTER) -> grpc.aio.Channel:
    """An asyncio channel to the worker at ``host:port`` (keepalive, TLS per ``cluster``)
    whose calls carry ``identity``'s token (the router's by default; none without a
    secret). ValueError for an identity :mod:`proto.grpc_auth` does not know."""
    creds = channel_credentials(cluster)
    options = channel_options(cluster)
    interceptors = aio_interceptors(cluster.credentials, identity, address)
    if creds is None:
        return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)
    return grpc.aio.secure_channel(address, creds, options=options, interceptors=interceptors)


def sync_channel(address: str, cluster: ClusterConfig, identity: str = MONITOR) -> grpc.Channel:
    """A blocking channel to the worker at ``host:port`` (health checks, tools) whose calls
    carry ``identity``'s token (``monitor`` by default: GetLoad and health; a tool that
    reserves or aborts asks for ``router``)."""
    creds = channel_credentials(cluster)
    options = channel_options(cluster)
    interceptors = sync_interceptors(cluster.credentials, identity, address)
    if creds is None:
        base = grpc.insecure_channel(address, options=options)
    else:
        base = grpc.secure_channel(address, creds, options=options)
    return grpc.intercept_channel(base, *interceptors) if interceptors else base


def server(cluster: ClusterConfig, audience: str | Callable[[], str]) -> grpc.aio.Server:
    """An asyncio gRPC server with the cluster's keepalive policy and, with a cluster
    secret, the token checks of :mod:`proto.grpc_auth` on every method (add a port with
    :func:`add_port`), accepting router tokens addressed to ``audience``: the ``host:port``
    the worker advertises (or what returns it, for a server bound to port 0 that learns its
    port later). Without a secret it logs, once per server, that anyone who reaches the port
    may call every verb."""
    named = audience if callable(audience) else lambda: audience
    interceptors = server_interceptors(cluster.credentials, named)
    if not interceptors:
        log.warning(
            "no cluster secret (KVSERVE_CLUSTER_SECRET): this worker's gRPC is "
            "unauthenticated; any peer that reaches its port may call every verb"
        )
    return grpc.aio.server(options=server_options(cluster), interceptors=interceptors)


def add_port(srv: grpc.aio.Server, address: str, cluster: ClusterConfig) -> int:
    """Listen on ``host:port`` (TLS per ``cluster``); returns the bound port."""
    creds = server_credentials(cluster)
    if creds is None:
        return srv.add_insecure_port(address)
    return srv.add_secure_port(address, creds)

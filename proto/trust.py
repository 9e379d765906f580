"""The cluster secret and the keys each plane derives from it.

One secret per cluster (:attr:`proto.registry.ClusterConfig.cluster_secret`, env
``KVSERVE_CLUSTER_SECRET``; ``kvserve up`` and the compose files make one up unless it is
given). Nothing uses the secret itself: each use derives its own key,
``HMAC-SHA256(secret, "kvserve/v1/" + purpose)``, so a key learned from one plane (say the
gRPC token seen on the wire) reveals nothing about another (say the pool's block MAC key).

Purposes (one constant each below, used nowhere else):

- :data:`PREFIX_ROOT`: the root of every prefix hash chain (:mod:`kvpool.hashing`), so no
  one without the secret can compute any chain, a tenant's or the shared one;
- :data:`POOL_BLOCK`: the MAC on every pool block's meta (:mod:`kvpool.pool`), and the name
  of a request's partial-block key (no live request id in the pool's key space);
- :data:`REGISTRY_RECORD`: the MAC on every worker record and on the contract in Redis
  (:mod:`proto.registry`);
- :data:`ROUTER_SIGN`: the router's Ed25519 signing key (the seed), with which it signs a
  token for each worker it calls (:mod:`proto.call_tokens`); workers hold its public key;
- :func:`grpc_token` of a bearer identity (:data:`MONITOR`): the token that identity presents
  on worker gRPC calls (:mod:`proto.grpc_auth`).

An empty secret is allowed (a process started by hand, tests): every derivation then uses
an empty key, which keeps every code path the same but protects nothing; processes log
that they run without one. :func:`check_secret` states what a real secret must look like.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

PREFIX_ROOT = "prefix-root"
POOL_BLOCK = "pool-block"
REGISTRY_RECORD = "registry-record"
ROUTER_SIGN = "router-sign"
PURPOSES = (PREFIX_ROOT, POOL_BLOCK, REGISTRY_RECORD, ROUTER_SIGN)
"""Every plane key's purpose (what a grant may hold: :mod:`proto.credentials`)."""
_GRPC_TOKEN = "grpc-token/"

ROUTER = "router"
"""The gRPC identity that calls every worker verb; its tokens are signed per call
(:mod:`proto.call_tokens`)."""
MONITOR = "monitor"
"""The gRPC identity that only observes (GetLoad, health); its token is a bearer token."""

MIN_SECRET_CHARS = 32
"""A secret is at least this many characters (``new_secret`` gives 64 hex digits)."""


def new_secret() -> str:
    """A fresh cluster secret: 256 random bits as 64 hex digits."""
    return secrets.token_hex(32)


def check_secret(secret: str) -> None:
    """Raise ValueError unless ``secret`` is empty (no secret) or a usable secret: at least
    :data:`MIN_SECRET_CHARS` printable ASCII characters without spaces."""
    if not secret:
        return
    if len(secret) < MIN_SECRET_CHARS:
        raise ValueError(
            f"cluster_secret is {len(secret)} characters; use at least {MIN_SECRET_CHARS} "
            f"(for example: python -c 'import secrets; print(secrets.token_hex(32))')"
        )
    if not all(33 <= ord(c) < 127 for c in secret):
        raise ValueError("cluster_secret must be printable ASCII without spaces")


def derive(secret: str, purpose: str) -> bytes:
    """The 32-byte key of ``purpose`` under ``secret`` (empty secret: an empty-key HMAC)."""
    return hmac.new(secret.encode(), b"kvserve/v1/" + purpose.encode(), hashlib.sha256).digest()


def grpc_token(secret: str, identity: str) -> str:
    """The bearer token of ``identity`` (hex; it names the identity, so a worker can tell
    who calls without trying every identity's token)."""
    return f"{identity}.{derive(secret, _GRPC_TOKEN + identity).hex()}"


def framed(*parts: bytes) -> bytes:
    """``parts`` as one string, each after its length (8 bytes, little-endian), so no two
    part lists give the same bytes: what is MAC'd (:func:`mac`) or signed."""
    return b"".join(len(part).to_bytes(8, "little") + part for part in parts)


def mac(key: bytes, *parts: bytes) -> bytes:
    """HMAC-SHA256 of ``parts``, framed (:func:`framed`: no two part lists collide)."""
    return hmac.new(key, framed(*parts), hashlib.sha256).digest()


def mac_ok(key: bytes, tag: bytes, *parts: bytes) -> bool:
    """Whether ``tag`` is the MAC of ``parts`` (constant-time comparison)."""
    return hmac.compare_digest(tag, mac(key, *parts))


def b64url(raw: bytes) -> str:
    """``raw`` in unpadded base64url (grants, router tokens)."""
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def unb64url(text: str) -> bytes:
    """The bytes of unpadded base64url ``text`` (:class:`binascii.Error` when it is not)."""
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))

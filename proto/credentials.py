"""What one process holds of the cluster's trust: the whole secret, or a grant cut from it.

The setting :attr:`proto.registry.ClusterConfig.cluster_secret` (env
``KVSERVE_CLUSTER_SECRET``) takes one of three forms, read by :meth:`Credentials.of`:

- empty: no secret. Every key is the empty-key derivation, no gRPC call is checked
  (:mod:`proto.grpc_auth`); it protects nothing (tests, a process started by hand);
- the cluster secret itself (at least :data:`proto.trust.MIN_SECRET_CHARS` printable
  characters): everything can be derived from it; what an operator holds, and what
  ``kvserve up`` and the compose ``secrets`` service keep for themselves;
- a grant, ``kvgrant2.<base64url JSON>`` (:meth:`Credentials.grant`): only the derived
  material one role needs (:mod:`proto.grants` says which), so a process that is broken
  into gives away that role's powers and no other's. A grant holds plane keys (purpose ->
  key; the router's signing key is one), bearer tokens this process may present (identity
  -> token) and gRPC verifiers it accepts (identity -> the SHA-256 of a bearer identity's
  token, or the router's Ed25519 public key: a worker checks the router's tokens without
  being able to make one, :mod:`proto.call_tokens`). Grants of an older format
  (``kvgrant1.``, whose router token was a bearer token) are refused: make new ones.

Asking a :class:`Credentials` for something it was not granted raises :class:`NotGrantedError`
naming what is missing, at start-up where the process first needs it.
"""

from __future__ import annotations

import binascii
import hashlib
import hmac
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from proto.call_tokens import Signer, public_key
from proto.trust import (
    PURPOSES,
    ROUTER,
    ROUTER_SIGN,
    b64url,
    check_secret,
    derive,
    grpc_token,
    unb64url,
)

GRANT_PREFIX = "kvgrant2."
_OLD_GRANT_PREFIXES = ("kvgrant1.",)
MAX_GRANT_CHARS = 4096
"""A grant is far shorter; anything longer is refused before it is decoded."""
_SECTIONS = ("keys", "tokens", "verifiers")


class NotGrantedError(LookupError):
    """This process's credentials lack what was asked for (a key, a token, a verifier)."""


def token_digest(token: str) -> bytes:
    """The verifier of ``token``: its SHA-256 (a worker stores this, not the token)."""
    return hashlib.sha256(token.encode()).digest()


def token_matches(verifier: bytes | None, token: str) -> bool:
    """Whether ``token`` has ``verifier`` (None: no token does), compared in constant time."""
    return verifier is not None and hmac.compare_digest(token_digest(token), verifier)


@dataclass(frozen=True)
class Credentials:
    """``secret``: the cluster secret when this process holds it (else empty); ``keys``,
    ``tokens``, ``verifiers``: a grant's contents (unused when ``secret`` is set).
    ``secured`` is False only for the empty setting. Nothing here appears in a repr."""

    secret: str = field(default="", repr=False)
    keys: Mapping[str, bytes] = field(default_factory=dict, repr=False)
    tokens: Mapping[str, str] = field(default_factory=dict, repr=False)
    verifiers: Mapping[str, bytes] = field(default_factory=dict, repr=False)
    secured: bool = False

    @classmethod
    def of(cls, setting: str) -> Credentials:
        """Parse the ``cluster_secret`` setting (module docstring); ValueError, naming the
        setting, when it is neither empty, a secret nor a well-formed grant."""
        if setting.startswith(GRANT_PREFIX):
            return _parse_grant(setting)
        if setting.startswith(_OLD_GRANT_PREFIXES):
            raise ValueError(
                "cluster_secret: a grant from an older kvserve (its router token was a bearer "
                "token); make new grants (kvserve grant ROLE, or restart kvserve up / compose)"
            )
        check_secret(setting)
        return cls(secret=setting, secured=bool(setting))

    def key(self, purpose: str) -> bytes:
        """The key of ``purpose`` (a :data:`proto.trust.PURPOSES` entry)."""
        if not self.secured or self.secret:
            return derive(self.secret, purpose)
        if purpose not in self.keys:
            raise NotGrantedError(f"this process's grant holds no {purpose} key")
        return self.keys[purpose]

    def token(self, identity: str) -> str:
        """The bearer token this process presents as ``identity`` (not the router: its
        tokens are signed per call, :meth:`signer`)."""
        if identity == ROUTER:
            raise ValueError("router tokens are signed for each worker: use signer()")
        if not self.secured or self.secret:
            return grpc_token(self.secret, identity)
        if identity not in self.tokens:
            raise NotGrantedError(f"this process's grant may not call workers as {identity!r}")
        return self.tokens[identity]

    def signer(self) -> Signer:
        """The router's token minter (:class:`NotGrantedError` without its signing key)."""
        return Signer(self.key(ROUTER_SIGN), ROUTER)

    def verifier(self, identity: str) -> bytes | None:
        """What checks a presented ``identity`` token (the router's public key, or a bearer
        token's digest), or None when this process accepts no such caller."""
        if self.secret:
            if identity == ROUTER:
                return public_key(derive(self.secret, ROUTER_SIGN))
            return token_digest(grpc_token(self.secret, identity))
        return self.verifiers.get(identity)

    def grant(self, keys: Iterable[str], tokens: Iterable[str], verifiers: Iterable[str]) -> str:
        """A grant of the named keys, tokens and verifiers, cut from these credentials
        (:class:`NotGrantedError` if they lack any; ValueError without a secret)."""
        if not self.secured:
            raise ValueError("no cluster secret to cut a grant from")
        body = {
            "keys": {p: self.key(p).hex() for p in sorted(keys)},
            "tokens": {i: self.token(i) for i in sorted(tokens)},
            "verifiers": {i: _need(self.verifier(i), i).hex() for i in sorted(verifiers)},
        }
        raw = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
        return GRANT_PREFIX + b64url(raw)


def _need(verifier: bytes | None, identity: str) -> bytes:
    if verifier is None:
        raise NotGrantedError(f"this process's grant holds no verifier of {identity!r}")
    return verifier


def _parse_grant(setting: str) -> Credentials:
    """The credentials a grant holds; ValueError for anything malformed."""
    if len(setting) > MAX_GRANT_CHARS:
        raise ValueError(f"cluster_secret: a grant is at most {MAX_GRANT_CHARS} characters")
    encoded = setting[len(GRANT_PREFIX) :]
    try:
        raw = unb64url(encoded)
        body = json.loads(raw)
    except (binascii.Error, ValueError) as exc:
        raise ValueError("cluster_secret: the grant is not base64url JSON") from exc
    if not isinstance(body, dict) or sorted(body) != sorted(_SECTIONS):
        raise ValueError(f"cluster_secret: a grant is an object of {', '.join(_SECTIONS)}")
    keys = {p: _hex32(v, f"key {p}") for p, v in _section(body, "keys").items()}
    if unknown := sorted(set(keys) - set(PURPOSES)):
        raise ValueError(f"cluster_secret: the grant names unknown keys {unknown}")
    tokens = _section(body, "tokens")
    for identity, token in tokens.items():
        malformed = len(token) > 256 or not token.isascii() or identity == ROUTER
        if malformed or not token.startswith(identity + "."):
            raise ValueError(f"cluster_secret: the grant's {identity} token is malformed")
    verifiers = {i: _hex32(v, f"verifier {i}") for i, v in _section(body, "verifiers").items()}
    return Credentials(
        keys=MappingProxyType(keys),
        tokens=MappingProxyType(dict(tokens)),
        verifiers=MappingProxyType(verifiers),
        secured=True,
    )


def _section(body: dict[str, object], name: str) -> dict[str, str]:
    section = body[name]
    if not isinstance(section, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in section.items()
    ):
        raise ValueError(f"cluster_secret: the grant's {name} must map names to strings")
    return section


def _hex32(value: str, what: str) -> bytes:
    try:
        key = bytes.fromhex(value)
    except ValueError:
        key = b""
    if len(key) != 32:
        raise ValueError(f"cluster_secret: the grant's {what} is not 64 hex digits")
    return key

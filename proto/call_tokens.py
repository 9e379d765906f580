"""The router's call tokens: signed, addressed to one worker, valid for seconds.

A bearer token every worker accepts is also a token every worker can replay to the others.
So the router does not present one: on each call it presents a token it signed for the
worker it dials, which no other worker accepts and which expires within seconds.

- **Signing**: Ed25519. The router holds the private key (the :data:`~proto.trust.ROUTER_SIGN`
  key of its grant, used as the Ed25519 seed); a worker holds only the public key (the
  ``router`` verifier of its grant), so it can check a router token but not make one.
- **Audience**: the ``host:port`` the router dials, which is the address the worker
  advertises in its registry record (the router dials nothing else). A worker accepts a
  token only for its own advertised address: a token a broken-into worker receives is
  addressed to itself, and worthless at every other worker. A forged registry record cannot
  redirect tokens either: the router addresses each token to the address it actually dials.
- **Expiry**: a token names its expiry (Unix ms); the router mints tokens that live
  :data:`LIFETIME_S` and mints a new one for a worker once half of that has passed. A worker
  refuses a token that has expired, or whose expiry lies further ahead than a fresh token's
  could (:data:`LIFETIME_S` + :data:`CLOCK_SKEW_S`: a token cannot be minted to last).
  Hosts' clocks must agree within :data:`CLOCK_SKEW_S` (NTP does far better).

Wire form: ``router.<expiry ms>.<audience, base64url>.<signature, base64url>``; the
signature covers a fixed context string, the audience and the expiry, length-prefixed.
Checking is memoized per token (a worker sees the same token on every call of a window), so
a call costs a dictionary lookup, and a signature check only once per window.
"""

from __future__ import annotations

import binascii
import threading
import time
from collections.abc import Callable

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from proto.trust import b64url, framed, unb64url

LIFETIME_S = 20.0
"""How long a router token is valid after it is minted."""
CLOCK_SKEW_S = 10.0
"""How far the router's and a worker's clocks may disagree."""
MAX_TOKEN_CHARS = 512
_CONTEXT = b"kvserve/v1/router-call"
_MEMO_LIMIT = 256
Clock = Callable[[], float]
"""Seconds since the Unix epoch (``time.time``; a test passes its own)."""


def _signed(audience: str, expiry_ms: int) -> bytes:
    return framed(_CONTEXT, audience.encode(), expiry_ms.to_bytes(8, "big"))


def public_key(seed: bytes) -> bytes:
    """The 32-byte Ed25519 public key of the signing key ``seed`` (32 bytes)."""
    return Ed25519PrivateKey.from_private_bytes(seed).public_key().public_bytes_raw()


class Signer:
    """Mints the router's tokens under ``seed`` (the router's signing key), one per audience
    at a time, re-minted once half its lifetime has passed. Thread-safe."""

    def __init__(self, seed: bytes, identity: str, clock: Clock = time.time) -> None:
        self._key = Ed25519PrivateKey.from_private_bytes(seed)
        self._identity = identity
        self._clock = clock
        self._lock = threading.Lock()
        self._minted: dict[str, tuple[float, str]] = {}  # audience -> (renew at, token)

    def token(self, audience: str) -> str:
        """A token for calls to ``audience`` (``host:port``) valid for at least half of
        :data:`LIFETIME_S` from now."""
        now = self._clock()
        with self._lock:
            renew_at, token = self._minted.get(audience, (0.0, ""))
            if now < renew_at:
                return token
            expiry_ms = int((now + LIFETIME_S) * 1000)
            signature = self._key.sign(_signed(audience, expiry_ms))
            token = f"{self._identity}.{expiry_ms}.{b64url(audience.encode())}.{b64url(signature)}"
            if len(self._minted) >= _MEMO_LIMIT:
                self._minted.clear()
            self._minted[audience] = (now + LIFETIME_S / 2, token)
            return token


class Verifier:
    """Checks tokens addressed to ``audience`` (read on each check: a worker bound to port 0
    learns its address after the server is built) under the router's ``public`` key."""

    def __init__(
        self, public: bytes, audience: Callable[[], str], clock: Clock = time.time
    ) -> None:
        self._key = Ed25519PublicKey.from_public_bytes(public)
        self._audience = audience
        self._clock = clock
        self._lock = threading.Lock()
        self._valid: dict[str, int] = {}  # token -> expiry ms, for tokens that checked out

    def why_not(self, token: str) -> str | None:
        """None when ``token`` is a valid router token for this worker now, else why not
        (for the refusal's details: nothing secret is in it)."""
        now_ms = int(self._clock() * 1000)
        with self._lock:
            expiry = self._valid.get(token)
        if expiry is not None:
            return None if now_ms <= expiry else "the router token has expired"
        parsed = _parse(token)
        if parsed is None:
            return "the router token is malformed"
        expiry, audience, signature = parsed
        if now_ms > expiry:
            return "the router token has expired"
        if expiry > now_ms + int((LIFETIME_S + CLOCK_SKEW_S) * 1000):
            return "the router token expires too far ahead (are the clocks in step?)"
        if audience != self._audience():
            return f"the router token is addressed to {audience!r}, not to this worker"
        try:
            self._key.verify(signature, _signed(audience, expiry))
        except InvalidSignature:
            return "the router token's signature does not check"
        with self._lock:
            if len(self._valid) >= _MEMO_LIMIT:
                self._valid = {t: e for t, e in self._valid.items() if e >= now_ms}
            self._valid[token] = expiry
        return None


def _parse(token: str) -> tuple[int, str, bytes] | None:
    """``(expiry ms, audience, signature)`` of a token's shape, or None (nothing verified)."""
    if len(token) > MAX_TOKEN_CHARS or not token.isascii():
        return None
    parts = token.split(".")
    if len(parts) != 4 or not parts[1].isdigit() or len(parts[1]) > 15:
        return None
    try:
        audience = unb64url(parts[2]).decode()
        signature = unb64url(parts[3])
    except (binascii.Error, ValueError):
        return None
    return (int(parts[1]), audience, signature) if len(signature) == 64 else None

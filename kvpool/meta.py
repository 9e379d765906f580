"""Block metas: what a reader checks before any block reaches the model.

A meta object is JSON: format version ``v``, namespace text ``ns``, wire layout ``wire``,
``writer``, one digest per layer ``sums`` (hex), for a request's partial block its valid
token count ``tokens`` and lease ``expires``, and ``mac``: HMAC-SHA256 under the pool block
key (``proto.trust.derive(secret, POOL_BLOCK)``, passed in as bytes) of the canonical JSON
list ``[v, ns, meta key, wire, writer, sums, tokens, expires]`` (``tokens`` 0 and
``expires`` 0.0 for a full block). The meta key is the block's name, so a MAC made for one
block fails under any other name: a pool member without the secret can neither forge a
meta for a name of its choice nor move a genuine block (meta and layers) under another
prefix's name, and the digests it covers pin every layer's bytes.

Layer digests (:func:`layer_digest`): the first 16 bytes of SHA-256 for the ``sha256``
algorithm (collision resistant: no other layer bytes match a MAC'd meta), xxh3-64 for
``xxh3`` (a checksum: it catches corruption, not a pool member who rewrites layer data; the
single-tenant choice). They run where the checksums always ran: on the writer's helper
thread as each layer is put, and on the lander thread as each layer is read.
"""

from __future__ import annotations

import ctypes
import enum
import hashlib
import hmac
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import xxhash

from kvpool.hashing import Namespace

META_VERSION = 2
"""2: hex layer digests of the namespace's algorithm and a MAC (1: xxh3-64 sums, no MAC)."""

DIGEST_BYTES = {"sha256": 16, "xxh3": 8}
"""Bytes of one layer digest, per algorithm."""

LayerDigest = Callable[[int, int], bytes]
"""``digest(ptr, size)``: the digest of ``size`` bytes of host memory at ``ptr`` (no copy)."""


def _view(ptr: int, size: int) -> memoryview:
    return memoryview((ctypes.c_char * size).from_address(ptr))


def _sha256_16(ptr: int, size: int) -> bytes:
    return hashlib.sha256(_view(ptr, size)).digest()[:16]


def _xxh3_64(ptr: int, size: int) -> bytes:
    return bytes(xxhash.xxh3_64_digest(_view(ptr, size)))


def layer_digest(algorithm: str) -> LayerDigest:
    """The layer digest function of ``algorithm`` (see the module docstring)."""
    return {"sha256": _sha256_16, "xxh3": _xxh3_64}[algorithm]


def digest_bytes(algorithm: str, data: bytes) -> bytes:
    """:func:`layer_digest` of bytes in hand (tests, tools)."""
    buf = ctypes.create_string_buffer(data, len(data))
    return layer_digest(algorithm)(ctypes.addressof(buf), len(data))


@dataclass(frozen=True)
class BlockMeta:
    """What a reader needs from a meta object that fits its namespace and layout and whose
    MAC verified."""

    sums: list[bytes]
    tokens: int = 0
    expires: float = 0.0


class MetaFault(enum.Enum):
    """Why a meta object is not usable."""

    BAD = "bad"
    """Unparseable, or of another format version, namespace or layout."""
    FORGED = "forged"
    """It fits, but its MAC does not verify: written without the cluster secret, or moved
    from another block's name, or altered."""


@dataclass(frozen=True)
class MetaCodec:
    """Writes and checks the metas of one pool member (namespace, layout, writer, key)."""

    namespace: Namespace
    wire: str
    writer: str
    num_layers: int
    block_key: bytes = field(default=b"", repr=False)

    def _mac(self, meta_key: str, writer: str, sums: list[str], tokens: int, expires: float) -> str:
        fields = [META_VERSION, self.namespace.key, meta_key, self.wire, writer, sums]
        text = json.dumps([*fields, tokens, expires], separators=(",", ":"))
        return hmac.new(self.block_key, text.encode(), hashlib.sha256).hexdigest()

    def encode(self, meta_key: str, sums: list[bytes], extra: dict[str, float]) -> bytes:
        """The meta object of the block named ``meta_key`` with layer digests ``sums`` and,
        for a partial block, ``extra`` = ``{"tokens": n, "expires": t}``."""
        hex_sums = [s.hex() for s in sums]
        tokens, expires = int(extra.get("tokens", 0)), float(extra.get("expires", 0.0))
        meta: dict[str, Any] = {
            "v": META_VERSION,
            "ns": self.namespace.key,
            "wire": self.wire,
            "writer": self.writer,
            "sums": hex_sums,
            **extra,
            "mac": self._mac(meta_key, self.writer, hex_sums, tokens, expires),
        }
        return json.dumps(meta, separators=(",", ":")).encode()

    def decode(self, raw: bytes, meta_key: str) -> BlockMeta | MetaFault:
        """The meta of the block named ``meta_key``, or why it must not be used. Verifies
        the MAC (constant-time comparison) after the format, namespace and layout."""
        try:
            meta = json.loads(raw)
            hex_sums = meta["sums"]
            width = DIGEST_BYTES[self.namespace.algorithm]
            sums = [bytes.fromhex(s) for s in hex_sums]
            fits = (
                meta["v"] == META_VERSION
                and meta["ns"] == self.namespace.key
                and meta["wire"] == self.wire
                and len(sums) == self.num_layers
                and all(len(s) == width for s in sums)
            )
            if not fits:
                return MetaFault.BAD
            tokens, expires = int(meta.get("tokens", 0)), float(meta.get("expires", 0.0))
            expected = self._mac(meta_key, str(meta["writer"]), hex_sums, tokens, expires)
            tag = meta.get("mac")
            if not isinstance(tag, str) or not hmac.compare_digest(tag.encode(), expected.encode()):
                return MetaFault.FORGED  # a fitting meta without a valid MAC
        except (ValueError, KeyError, TypeError, AttributeError):
            return MetaFault.BAD
        return BlockMeta(sums=sums, tokens=tokens, expires=expires)

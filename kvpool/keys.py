"""The pool's key space and the prefix lookup, usable without any KV memory (the router).

Every key starts with the namespace tag ``kv<hash version>.<namespace seed>`` (a digest of
model identity, dtype, KV layout, block size, algorithm and hash version; meta objects also
carry the full namespace text):

- ``<tag>/b/<block name>``: a full prefix block's meta object, the name in hex at the
  algorithm's width (64 digits for sha256, 32 for xxh3); ``.../<layer>``: its layers;
- ``<tag>/r/<request name>``: a request's partial last block; ``.../<layer>``: its layers.
  The request name is ``HMAC-SHA256(pool block key, "request" NUL request id)`` in hex, so
  the pool's key listing (Mooncake's HTTP port lists every key) shows no live request id,
  and only a holder of the cluster secret can tell which request a key belongs to.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, field

from kvpool.hashing import HASH_BITS, HASH_VERSION, Namespace
from kvpool.store import MooncakeStore

_REQUEST_NAME = b"request\x00"
"""Domain of request names under the pool block key (block MACs hash JSON, never this)."""


@dataclass(frozen=True)
class KeySpace:
    """Pool keys of one namespace: its ``seed`` (the digest of the namespace, which a worker
    record carries) and hash version fix the tag, ``hash_bits`` the width of block names,
    ``block_key`` (``proto.trust.derive(secret, POOL_BLOCK)``; empty: no secret) the names
    of request-scoped keys."""

    seed: int
    num_layers: int
    hash_version: int = HASH_VERSION
    hash_bits: int = HASH_BITS["sha256"]
    block_key: bytes = field(default=b"", repr=False)

    @classmethod
    def of(cls, namespace: Namespace, num_layers: int, block_key: bytes = b"") -> KeySpace:
        return cls(
            namespace.seed, num_layers, namespace.hash_version, namespace.hash_bits, block_key
        )

    @property
    def tag(self) -> str:
        return f"kv{self.hash_version}.{self.seed:016x}"

    def meta_key(self, block_hash: int) -> str:
        return f"{self.tag}/b/{block_hash:0{self.hash_bits // 4}x}"

    def request_key(self, request_id: str) -> str:
        """The key of ``request_id``'s partial block: named by a keyed digest of the id,
        never the id itself."""
        if not request_id:
            raise ValueError("request id must be non-empty")
        name = hmac.new(self.block_key, _REQUEST_NAME + request_id.encode(), hashlib.sha256)
        return f"{self.tag}/r/{name.hexdigest()}"

    def layer_keys(self, meta_key: str) -> list[str]:
        return [f"{meta_key}/{layer}" for layer in range(self.num_layers)]

    def block_keys(self, block_hash: int) -> list[str]:
        """The meta key, then every layer key, of one block."""
        meta = self.meta_key(block_hash)
        return [meta, *self.layer_keys(meta)]


def completeness(store: MooncakeStore, keys: KeySpace, hashes: list[int]) -> list[bool | None]:
    """Per block, in one batched existence call: True when the meta and every layer exist,
    None when only some of its objects do, False when none does."""
    flags = store.exists([k for h in hashes for k in keys.block_keys(h)])
    per = keys.num_layers + 1
    out: list[bool | None] = []
    for i in range(len(hashes)):
        block = [f == 1 for f in flags[i * per : (i + 1) * per]]
        out.append(True if all(block) else (None if any(block) else False))
    return out


def longest_prefix(store: MooncakeStore, keys: KeySpace, hashes: list[int]) -> int:
    """How many leading blocks of the chain ``hashes`` are present in the pool."""
    return next(
        (i for i, c in enumerate(completeness(store, keys, hashes)) if c is not True),
        len(hashes),
    )

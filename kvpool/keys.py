"""The pool's key space and the prefix lookup, usable without any KV memory (the router).

Every key starts with the namespace tag ``kv<hash version>.<namespace seed>`` (a digest of
model identity, dtype, KV layout, block size and hash version; meta objects also carry the
full namespace text):

- ``<tag>/b/<block hash>``: a full prefix block's meta object; ``.../<layer>``: its layers;
- ``<tag>/r/<request id>``: a request's partial last block; ``.../<layer>``: its layers.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvpool.hashing import HASH_VERSION, Namespace
from kvpool.store import MooncakeStore


@dataclass(frozen=True)
class KeySpace:
    """Pool keys of one namespace: its ``seed`` (the digest of the namespace, which a worker
    record carries) and hash version fix the tag."""

    seed: int
    num_layers: int
    hash_version: int = HASH_VERSION

    @classmethod
    def of(cls, namespace: Namespace, num_layers: int) -> KeySpace:
        return cls(namespace.seed, num_layers, namespace.hash_version)

    @property
    def tag(self) -> str:
        return f"kv{self.hash_version}.{self.seed:016x}"

    def meta_key(self, block_hash: int) -> str:
        return f"{self.tag}/b/{block_hash:016x}"

    def request_key(self, request_id: str) -> str:
        if "/" in request_id or not request_id:
            raise ValueError(f"request id must be non-empty without '/', got {request_id!r}")
        return f"{self.tag}/r/{request_id}"

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

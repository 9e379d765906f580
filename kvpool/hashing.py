"""The one deterministic block hash of the cluster.

A prompt is cut into blocks of ``block_tokens`` token ids. Block ``i`` is named by a chained
hash: ``h_i = xxh3_64(h_{i-1} || token_ids_i, seed)``, with ``h_{-1} = 0`` and ``seed`` derived
from the :class:`Namespace`. Equal hashes therefore mean equal *prefixes* (the whole prompt up
to and including the block), not just equal blocks, and two clusters that differ in model,
dtype, KV layout, block size or hash version never share a name.

Only full blocks are hashed: a partial last block is not a cacheable prefix.

The encoding is fixed and pinned by a golden-value test (``tests/unit/test_hashing.py``):
the parent as 8 little-endian bytes, then each token id as 4 little-endian unsigned bytes.
Changing it means bumping :data:`HASH_VERSION`. Never use Python's ``hash()`` for this:
it is salted per process.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import xxhash

HASH_VERSION = 1
"""Bumped whenever the byte encoding or the chaining rule changes."""

KV_LAYOUT = "paged-v1:[blocks,2,block_tokens,kv_heads,head_dim]"
"""The per-layer KV cache layout that pool objects carry (see DESIGN.md)."""

ROOT_PARENT = 0


@dataclass(frozen=True)
class Namespace:
    """Everything that must match for two workers to share KV blocks.

    ``model`` is the model identity (name and weights fingerprint), ``dtype`` the KV dtype
    (e.g. ``"float32"``), ``block_tokens`` the tokens per block.
    """

    model: str
    dtype: str
    block_tokens: int
    kv_layout: str = KV_LAYOUT
    hash_version: int = HASH_VERSION

    def __post_init__(self) -> None:
        if self.block_tokens <= 0:
            raise ValueError(f"block_tokens must be positive, got {self.block_tokens}")
        if not self.model:
            raise ValueError("namespace needs a model identity")

    @cached_property
    def key(self) -> str:
        """Canonical text form, used as the prefix of every pool key."""
        return (
            f"kvs{self.hash_version}|{self.model}|{self.dtype}|bt{self.block_tokens}"
            f"|{self.kv_layout}"
        )

    @cached_property
    def seed(self) -> int:
        """The 64-bit xxh3 seed that every block hash of this namespace uses."""
        return xxhash.xxh3_64_intdigest(self.key.encode())


def hash_block(parent: int, token_ids: Sequence[int], seed: int) -> int:
    """Hash one block given its parent's hash (``ROOT_PARENT`` for the first block)."""
    data = parent.to_bytes(8, "little") + np.asarray(token_ids, dtype="<u4").tobytes()
    return xxhash.xxh3_64_intdigest(data, seed=seed)


def hash_chain(
    token_ids: Sequence[int], block_tokens: int, seed: int, parent: int = ROOT_PARENT
) -> list[int]:
    """Hashes of every *full* block of ``token_ids``, chained from ``parent``."""
    hashes: list[int] = []
    for start in range(0, len(token_ids) - block_tokens + 1, block_tokens):
        parent = hash_block(parent, token_ids[start : start + block_tokens], seed)
        hashes.append(parent)
    return hashes


def salt_root(salt: str, seed: int) -> int:
    """The parent of a salted chain's first block: :data:`ROOT_PARENT` without a salt, else
    a hash of the salt text. Requests with different salts (tenants) never share a block
    name, so they never share cached prefixes, locally or in the pool."""
    if not salt:
        return ROOT_PARENT
    return xxhash.xxh3_64_intdigest(b"cache-salt\x00" + salt.encode(), seed=seed)

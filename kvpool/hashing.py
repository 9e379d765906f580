"""The one deterministic, keyed prefix identity of the cluster.

A prompt is cut into blocks of ``block_tokens`` token ids. Block ``i`` is named by a chained
keyed hash, ``h_i = H_k(h_{i-1} || token_ids_i)``, so equal names mean equal *prefixes* (the
whole prompt up to and including the block), not just equal blocks. The link key ``k`` is
``HMAC-SHA256(root key, 0x01 || "chain-link")`` (:attr:`PrefixHasher.link_key`), so a name
seen somewhere (the pool's key listing, the KV event stream) does not let anyone without the
key extend the chain and confirm a guessed next block. :class:`PrefixHasher` holds the rule;
its :attr:`Namespace.algorithm` picks ``H``:

- ``sha256`` (the default): ``H_k = HMAC-SHA256`` under ``k`` of the parent as 32 big-endian
  bytes (the parent digest itself) followed by the tokens; names are 256-bit ints.
  Collision resistant: no one can find two prefixes with one name;
- ``xxh3``: ``H_k = xxh3-128`` seeded with the first 8 bytes of ``k`` (big-endian) XOR
  :attr:`Namespace.seed`, of the parent as 16 big-endian bytes then the tokens; 128-bit
  names. Fast, but neither collision resistant nor a keyed hash in the cryptographic sense
  (a 64-bit seed): an explicit choice for a single-tenant cluster.

The root ``h_{-1}`` of every chain, salted or not, is ``HMAC-SHA256(root key, namespace
key || NUL || salt)`` truncated to the algorithm's width (:meth:`PrefixHasher.root`). The
root key is derived from the cluster secret (``proto.trust.derive(secret, PREFIX_ROOT)``,
passed in as bytes: this package does not import ``proto``), so without the secret nobody
can compute any chain, a tenant's or the unsalted one, and requests with different salts
(tenants) never share a block name, locally or in the pool. An empty key (no secret: tests,
simulations) keeps every code path but protects nothing.

Two clusters that differ in model, dtype, KV layout, block size, algorithm or hash version
never share a name: all of them are in the namespace key text. Only full blocks are hashed:
a partial last block is not a cacheable prefix.

The encoding is fixed and pinned by a golden-value test (``tests/unit/test_hashing.py``):
each token id as 4 little-endian unsigned bytes after the parent bytes. Changing it means
bumping :data:`HASH_VERSION`. Never use Python's ``hash()`` for this: it is salted per
process.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import xxhash

HASH_VERSION = 3
"""Bumped whenever the byte encoding or the chaining rule changes (3: every link keyed; 2:
keyed roots, unkeyed SHA-256 or xxh3-128 links; 1 was an unkeyed xxh3-64 chain)."""

ALGORITHMS = ("sha256", "xxh3")
"""Chain (and pool layer digest) algorithms; ``proto.registry.HASH_ALGORITHMS`` names the same
(this package cannot import it)."""

HASH_BITS = {"sha256": 256, "xxh3": 128}
"""Width of a block name, per algorithm."""

KV_LAYOUT = "paged-v1:[blocks,2,block_tokens,kv_heads,head_dim]"
"""The per-layer KV cache layout that pool objects carry (see DESIGN.md)."""


@dataclass(frozen=True)
class Namespace:
    """Everything that must match for two workers to share KV blocks.

    ``model`` is the model identity (name and weights fingerprint), ``dtype`` the KV dtype
    (e.g. ``"float32"``), ``block_tokens`` the tokens per block, ``algorithm`` the chain and
    layer digest algorithm (one of :data:`ALGORITHMS`).
    """

    model: str
    dtype: str
    block_tokens: int
    algorithm: str = "sha256"
    kv_layout: str = KV_LAYOUT
    hash_version: int = HASH_VERSION

    def __post_init__(self) -> None:
        if self.block_tokens <= 0:
            raise ValueError(f"block_tokens must be positive, got {self.block_tokens}")
        if not self.model:
            raise ValueError("namespace needs a model identity")
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {self.algorithm!r}")

    @cached_property
    def key(self) -> str:
        """Canonical text form (in every worker's KV contract; :meth:`parse` inverts it)."""
        return (
            f"kvs{self.hash_version}|{self.algorithm}|{self.model}|{self.dtype}"
            f"|bt{self.block_tokens}|{self.kv_layout}"
        )

    @cached_property
    def seed(self) -> int:
        """xxh3-64 of :attr:`key`: the pool key-space tag (:class:`kvpool.keys.KeySpace`) and
        the seed of ``xxh3`` chains. Public: it protects nothing."""
        return xxhash.xxh3_64_intdigest(self.key.encode())

    @property
    def hash_bits(self) -> int:
        """Width of this namespace's block names."""
        return HASH_BITS[self.algorithm]

    @classmethod
    def parse(cls, text: str) -> Namespace:
        """The namespace whose :attr:`key` is ``text`` (``ValueError`` if there is none, or
        it is of another hash version than this code computes)."""
        parts = text.split("|")
        if len(parts) < 6 or parts[0] != f"kvs{HASH_VERSION}" or not parts[-2].startswith("bt"):
            raise ValueError(f"not a version {HASH_VERSION} namespace: {text!r}")
        try:
            block_tokens = int(parts[-2][2:])
        except ValueError:
            raise ValueError(f"bad block size in namespace {text!r}") from None
        namespace = cls(
            model="|".join(parts[2:-3]),
            dtype=parts[-3],
            block_tokens=block_tokens,
            algorithm=parts[1],
            kv_layout=parts[-1],
        )
        if namespace.key != text:
            raise ValueError(f"not a canonical namespace: {text!r}")
        return namespace


def token_bytes(token_ids: Sequence[int]) -> bytes:
    """Token ids as 4 little-endian unsigned bytes each (``ValueError`` if one does not fit)."""
    try:
        return struct.pack(f"<{len(token_ids)}I", *token_ids)
    except struct.error as exc:
        raise ValueError(f"token ids must fit 4 unsigned bytes: {exc}") from None


@dataclass(frozen=True)
class PrefixHasher:
    """Block names of one namespace under one root key (see the module docstring).

    ``root_key`` is ``proto.trust.derive(cluster_secret, PREFIX_ROOT)``; empty (the default)
    only where nothing needs protecting (tests, simulations: anyone can compute the chains).
    Stateless apart from cached roots: safe to share between threads.
    """

    namespace: Namespace
    root_key: bytes = field(default=b"", repr=False)

    @property
    def algorithm(self) -> str:
        return self.namespace.algorithm

    @property
    def bits(self) -> int:
        """Width of every name (and root) in bits: 256 (sha256) or 128 (xxh3)."""
        return self.namespace.hash_bits

    def root(self, salt: str = "") -> int:
        """The parent of the first block of the chain of cache salt ``salt`` (``""``: the
        unsalted chain): ``HMAC-SHA256(root_key, namespace key || NUL || salt)``, truncated
        to :attr:`bits`. Distinct salts give distinct roots (and so distinct chains)."""
        if not salt:
            return self.unsalted_root
        return self._root(salt)

    @cached_property
    def unsalted_root(self) -> int:
        """:meth:`root` of the empty salt (computed once)."""
        return self._root("")

    def _root(self, salt: str) -> int:
        text = self.namespace.key.encode() + b"\x00" + salt.encode()
        digest = hmac.new(self.root_key, text, hashlib.sha256).digest()
        return int.from_bytes(digest[: self.bits // 8], "big")

    def block(self, parent: int, token_ids: Sequence[int]) -> int:
        """The name of one block given its parent's name (:meth:`root` for the first)."""
        return self._block(parent, token_bytes(token_ids))

    @cached_property
    def link_key(self) -> bytes:
        """The key of every link of every chain (module docstring)."""
        return hmac.new(self.root_key, b"\x01chain-link", hashlib.sha256).digest()

    @cached_property
    def _link_mac(self) -> hmac.HMAC:
        """An HMAC under :attr:`link_key` with nothing fed yet, copied for each link."""
        return hmac.new(self.link_key, digestmod=hashlib.sha256)

    @cached_property
    def _link_seed(self) -> int:
        """The seed of ``xxh3`` links: :attr:`link_key`'s first 8 bytes XOR the namespace's."""
        return int.from_bytes(self.link_key[:8], "big") ^ self.namespace.seed

    def _block(self, parent: int, data: bytes) -> int:
        if self.algorithm == "sha256":
            link = self._link_mac.copy()
            link.update(parent.to_bytes(32, "big") + data)
            return int.from_bytes(link.digest(), "big")
        return int(xxhash.xxh3_128_intdigest(parent.to_bytes(16, "big") + data, self._link_seed))

    def chain(
        self, token_ids: Sequence[int], block_tokens: int, parent: int | None = None
    ) -> list[int]:
        """Names of every *full* block of ``token_ids``, chained from ``parent`` (``None``:
        the unsalted :meth:`root`). A prefix property: the chain of a prompt's first ``k``
        blocks is the first ``k`` names of the chain of the whole prompt."""
        n = len(token_ids) // block_tokens
        data = token_bytes(token_ids[: n * block_tokens])
        step = 4 * block_tokens
        parent = self.unsalted_root if parent is None else parent
        names: list[int] = []
        for start in range(0, n * step, step):
            parent = self._block(parent, data[start : start + step])
            names.append(parent)
        return names

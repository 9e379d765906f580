"""What a pool member needs from the cluster's trust settings, as plain bytes.

This package does not import ``proto``: callers (a worker, the router) derive the keys from
their own cluster configuration and hand them in::

    Keyring(
        cluster.hash_algorithm,
        prefix_root=derive(cluster.cluster_secret, PREFIX_ROOT),
        pool_block=derive(cluster.cluster_secret, POOL_BLOCK),
    )

The default keyring (``sha256``, empty keys) is that of a cluster without a secret: every
check runs, none protects against a pool member (tests, simulations, a process started by
hand).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvpool.hashing import ALGORITHMS


@dataclass(frozen=True)
class Keyring:
    """``algorithm``: prefix chain and layer digest algorithm (:data:`ALGORITHMS`);
    ``prefix_root``: the key of every chain's root (:class:`kvpool.hashing.PrefixHasher`);
    ``pool_block``: the key of block metas' MACs and of request-scoped key names
    (:class:`kvpool.pool.KVPool`, :class:`kvpool.keys.KeySpace`). Keys never appear in a
    ``repr``."""

    algorithm: str = "sha256"
    prefix_root: bytes = field(default=b"", repr=False)
    pool_block: bytes = field(default=b"", repr=False)

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {self.algorithm!r}")

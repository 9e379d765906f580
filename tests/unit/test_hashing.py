from __future__ import annotations

import pytest

from kvpool.hashing import ROOT_PARENT, Namespace, hash_block, hash_chain, salt_root

NS = Namespace(model="tiny@0123", dtype="float32", block_tokens=4)


def test_golden_values() -> None:
    # Pinned: changing these means every pool key in every deployment changes.
    assert NS.key == (
        "kvs1|tiny@0123|float32|bt4|paged-v1:[blocks,2,block_tokens,kv_heads,head_dim]"
    )
    assert NS.seed == 0xB1ACE285E60AF083
    assert hash_block(ROOT_PARENT, [1, 2, 3, 4], seed=0) == 0x341839ABBE30BE0B
    assert hash_chain([1, 2, 3, 4, 5, 6, 7, 8, 9], 4, NS.seed) == [
        0x7FB7BB83FB66E8E8,
        0x6C2DD80BCB766D3D,
    ]


def test_chain_hashes_prefixes_not_blocks() -> None:
    a = hash_chain([1, 2, 3, 4, 5, 6, 7, 8], 4, NS.seed)
    b = hash_chain([9, 9, 9, 9, 5, 6, 7, 8], 4, NS.seed)
    assert a[0] != b[0]
    assert a[1] != b[1]  # same second block, different prefix
    assert hash_chain([1, 2, 3, 4, 0, 0, 0, 0], 4, NS.seed)[0] == a[0]


def test_only_full_blocks_are_hashed() -> None:
    assert hash_chain([1, 2, 3], 4, NS.seed) == []
    assert len(hash_chain(list(range(11)), 4, NS.seed)) == 2


def test_namespace_separates_clusters() -> None:
    other = Namespace(model="tiny@0123", dtype="bfloat16", block_tokens=4)
    assert other.seed != NS.seed
    assert hash_chain([1, 2, 3, 4], 4, other.seed) != hash_chain([1, 2, 3, 4], 4, NS.seed)


def test_namespace_validation() -> None:
    with pytest.raises(ValueError, match="block_tokens"):
        Namespace(model="m", dtype="float32", block_tokens=0)
    with pytest.raises(ValueError, match="model identity"):
        Namespace(model="", dtype="float32", block_tokens=4)


def test_salt_root() -> None:
    assert salt_root("", NS.seed) == ROOT_PARENT  # no salt: the unsalted chain
    assert salt_root("tenant-a", NS.seed) == 0xF501DA5448C8F287  # pinned (see golden values)
    assert salt_root("tenant-a", NS.seed) != salt_root("tenant-b", NS.seed)
    salted = hash_chain([1, 2, 3, 4], 4, NS.seed, salt_root("tenant-a", NS.seed))
    assert salted != hash_chain([1, 2, 3, 4], 4, NS.seed)

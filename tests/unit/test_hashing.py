"""The keyed prefix chain (kvpool/hashing.py): pinned values, the spec re-derived with
hashlib/hmac/xxhash directly, and the properties the pool and tenants rely on."""

from __future__ import annotations

import hashlib
import hmac
import struct

import pytest
import xxhash

from kvpool.hashing import ALGORITHMS, HASH_BITS, Namespace, PrefixHasher
from proto.registry import HASH_ALGORITHMS

KEY = b"k" * 32
NS = Namespace(model="tiny@0123", dtype="float32", block_tokens=4)
NS_XXH3 = Namespace(model="tiny@0123", dtype="float32", block_tokens=4, algorithm="xxh3")
SHA = PrefixHasher(NS, KEY)
XXH = PrefixHasher(NS_XXH3, KEY)
TOKENS = [1, 2, 3, 4, 5, 6, 7, 8, 9]


def test_golden_values() -> None:
    # Pinned: changing these means every pool key in every deployment changes.
    layout = "paged-v1:[blocks,2,block_tokens,kv_heads,head_dim]"
    assert NS.key == f"kvs3|sha256|tiny@0123|float32|bt4|{layout}"
    assert NS_XXH3.key == f"kvs3|xxh3|tiny@0123|float32|bt4|{layout}"
    assert NS.seed == 0x6C10561D57E48795
    assert SHA.root() == 0x0F4B4882643A5C52C9166B3409B0E585EFCD3A1D75DB4DED03251A38982E8958
    assert SHA.root("tenant-a") == (
        0x0B07F0FDAAF4D8F86857971EB38B6603D81F285F37BB5273F65EBC27B2D27627
    )
    assert SHA.chain(TOKENS, 4) == [
        0xBDADA4ED636BD11F5813A658975D22B2EBF367EE2E70B1960AD50F2399CDCF39,
        0x2F9E72CBBB372C5C43E89566E7D20B89999F2A449D5D15ECC24B145A64FEB766,
    ]
    assert XXH.root() == 0x2829E0D6AB8FBE23B23F4364D2C0FF20
    assert XXH.chain(TOKENS, 4) == [
        0x540C86253E4460C152C8D89505ADBE19,
        0x3FBEE5390D53D8A861AE1AAD04A394F7,
    ]


def _root(ns: Namespace, salt: str) -> bytes:
    return hmac.new(KEY, ns.key.encode() + b"\0" + salt.encode(), hashlib.sha256).digest()


def test_the_spec_rederived() -> None:
    """The module docstring's rule, computed here without kvpool.hashing."""
    tokens = struct.pack("<4I", 1, 2, 3, 4)
    link = hmac.new(KEY, b"\x01chain-link", hashlib.sha256).digest()
    root = _root(NS, "tenant-a")
    first = hmac.new(link, root + tokens, hashlib.sha256).digest()
    assert SHA.chain([1, 2, 3, 4], 4, SHA.root("tenant-a")) == [int.from_bytes(first, "big")]
    root16 = _root(NS_XXH3, "")[:16]
    seed = int.from_bytes(link[:8], "big") ^ NS_XXH3.seed
    expected = xxhash.xxh3_128_intdigest(root16 + tokens, seed=seed)
    assert XXH.chain([1, 2, 3, 4], 4) == [expected]


@pytest.mark.parametrize("hasher", [SHA, XXH], ids=ALGORITHMS)
def test_a_name_seen_does_not_extend_without_the_key(hasher: PrefixHasher) -> None:
    """Someone who sees a block's name (the pool's key listing, the KV event stream) and
    guesses the next block's tokens cannot compute the next name without the key: the
    same rule under any other key gives another name."""
    first, second = hasher.chain(TOKENS[:8], 4)
    for other in (b"", b"x" * 32):
        guess = PrefixHasher(hasher.namespace, other).block(first, TOKENS[4:8])
        assert guess != second


@pytest.mark.parametrize("hasher", [SHA, XXH], ids=ALGORITHMS)
def test_widths(hasher: PrefixHasher) -> None:
    bits = HASH_BITS[hasher.algorithm]
    assert hasher.bits == bits == {"sha256": 256, "xxh3": 128}[hasher.algorithm]
    names = [hasher.root(), hasher.root("t"), *hasher.chain(list(range(400)), 4)]
    assert all(0 <= n < 1 << bits for n in names)
    assert max(names).bit_length() > bits - 16  # the whole width is used


@pytest.mark.parametrize("hasher", [SHA, XXH], ids=ALGORITHMS)
def test_chain_is_a_prefix_property(hasher: PrefixHasher) -> None:
    a = hasher.chain([1, 2, 3, 4, 5, 6, 7, 8], 4)
    b = hasher.chain([9, 9, 9, 9, 5, 6, 7, 8], 4)
    assert a[0] != b[0]
    assert a[1] != b[1]  # same second block, different prefix
    assert hasher.chain([1, 2, 3, 4, 0, 0, 0, 0], 4)[0] == a[0]
    assert hasher.chain(list(range(40)), 4)[:5] == hasher.chain(list(range(20)), 4)
    assert hasher.block(a[0], [5, 6, 7, 8]) == a[1]
    assert hasher.chain([5, 6, 7, 8], 4, parent=a[0]) == a[1:]


def test_only_full_blocks_are_hashed() -> None:
    assert SHA.chain([1, 2, 3], 4) == []
    assert len(SHA.chain(list(range(11)), 4)) == 2


def test_namespace_separates_clusters() -> None:
    other = Namespace(model="tiny@0123", dtype="bfloat16", block_tokens=4)
    assert other.seed != NS.seed
    assert PrefixHasher(other, KEY).chain([1, 2, 3, 4], 4) != SHA.chain([1, 2, 3, 4], 4)


def test_algorithms_never_share_names() -> None:
    assert NS.seed != NS_XXH3.seed  # the algorithm is in the namespace text: another tag
    assert set(SHA.chain(TOKENS, 4)).isdisjoint(XXH.chain(TOKENS, 4))
    assert ALGORITHMS == HASH_ALGORITHMS  # kvpool's list is the cluster setting's


def test_tenants_never_share_a_name() -> None:
    """Two tenants' chains of one prompt share no block name, nor with the unsalted one."""
    tokens = list(range(64))
    chains = [SHA.chain(tokens, 4, SHA.root(salt)) for salt in ("", "tenant-a", "tenant-b")]
    names = [n for chain in chains for n in chain]
    assert len(set(names)) == len(names) == 3 * 16
    assert len({SHA.root(s) for s in ("", "a", "b", "a\0", "tenant-a")}) == 5


def test_without_the_key_no_chain_can_be_reproduced() -> None:
    """Every root, the unsalted one included, depends on the key: another (or no) key gives
    other names for every block, so a party without the cluster secret cannot compute a
    victim's names (nor probe for them)."""
    tokens = list(range(32))
    for guess in (b"", b"k" * 31 + b"j", hashlib.sha256(b"guess").digest()):
        forger = PrefixHasher(NS, guess)
        for salt in ("", "tenant-a"):
            assert forger.root(salt) != SHA.root(salt)
            theirs = forger.chain(tokens, 4, forger.root(salt))
            assert set(theirs).isdisjoint(SHA.chain(tokens, 4, SHA.root(salt)))


def test_namespace_text_round_trips() -> None:
    odd = Namespace(model="m|with|bars@1", dtype="bfloat16", block_tokens=16, algorithm="xxh3")
    for ns in (NS, NS_XXH3, odd):
        assert Namespace.parse(ns.key) == ns
    md5 = NS.key.replace("sha256", "md5")
    for bad in ("", "kvs1|tiny|float32|bt4|x", NS.key.replace("bt4", "btx"), md5):
        with pytest.raises(ValueError):
            Namespace.parse(bad)


def test_validation() -> None:
    with pytest.raises(ValueError, match="block_tokens"):
        Namespace(model="m", dtype="float32", block_tokens=0)
    with pytest.raises(ValueError, match="model identity"):
        Namespace(model="", dtype="float32", block_tokens=4)
    with pytest.raises(ValueError, match="algorithm"):
        Namespace(model="m", dtype="float32", block_tokens=4, algorithm="md5")
    with pytest.raises(ValueError, match="4 unsigned bytes"):
        SHA.chain([1, 2, 3, 1 << 32], 4)
    with pytest.raises(ValueError, match="4 unsigned bytes"):
        SHA.block(SHA.root(), [-1])
    assert "k" * 8 not in repr(SHA)  # the key never shows

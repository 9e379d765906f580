"""Pool key names and block metas under the cluster's keys (kvpool/keys.py, kvpool/meta.py),
without a pool: request-scoped keys carry no request id, block names have the algorithm's
width, and a meta verifies only under the key and the name it was made for."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from kvpool.hashing import Namespace, PrefixHasher
from kvpool.keyring import Keyring
from kvpool.keys import KeySpace
from kvpool.meta import DIGEST_BYTES, BlockMeta, MetaCodec, MetaFault, digest_bytes
from proto.trust import POOL_BLOCK, derive

NS = Namespace(model="tiny@0", dtype="float32", block_tokens=4)
KEY = derive("s" * 64, POOL_BLOCK)
WIRE = "L2xbt4xH1xD8xfloat32"
CODEC = MetaCodec(NS, WIRE, "writer-1", 2, KEY)
SUMS = [digest_bytes("sha256", b"layer 0"), digest_bytes("sha256", b"layer 1")]


@pytest.mark.parametrize("request_id", ["req-42", "chatcmpl-7f3a9c", "r/with/slashes", "é"])
def test_request_keys_carry_no_request_id(request_id: str) -> None:
    keys = KeySpace.of(NS, 2, KEY)
    key = keys.request_key(request_id)
    name = key.rpartition("/")[2]
    assert request_id not in key and request_id.encode().hex() not in key
    assert key.startswith(keys.tag + "/r/") and len(name) == 64 and int(name, 16) >= 0
    assert key == keys.request_key(request_id)  # a name the decode side finds again
    assert key != keys.request_key(request_id + "x")
    assert key != KeySpace.of(NS, 2, derive("t" * 64, POOL_BLOCK)).request_key(request_id)
    with pytest.raises(ValueError):
        keys.request_key("")


def test_block_names_have_the_algorithm_width() -> None:
    for algorithm, digits in (("sha256", 64), ("xxh3", 32)):
        ns = Namespace(model="tiny@0", dtype="float32", block_tokens=4, algorithm=algorithm)
        first = PrefixHasher(ns).chain([1, 2, 3, 4], 4)[0]
        keys = KeySpace.of(ns, 2)
        assert keys.meta_key(first) == f"{keys.tag}/b/{first:0{digits}x}"
        assert len(keys.meta_key(1).rpartition("/")[2]) == digits
        assert len(digest_bytes(algorithm, b"x")) == DIGEST_BYTES[algorithm]


def test_keys_never_show() -> None:
    ring = Keyring("sha256", b"p" * 32, b"b" * 32)
    assert "pppp" not in repr(ring) and "bbbb" not in repr(ring)
    assert "bbbb" not in repr(KeySpace.of(NS, 2, b"b" * 32))
    with pytest.raises(ValueError):
        Keyring("md5")


def test_a_meta_verifies_under_its_key_and_name_only() -> None:
    raw = CODEC.encode("t/b/01", SUMS, {})
    assert CODEC.decode(raw, "t/b/01") == BlockMeta(sums=SUMS)
    assert CODEC.decode(raw, "t/b/02") is MetaFault.FORGED  # moved under another name
    for other_key in (b"", derive("t" * 64, POOL_BLOCK)):
        forger = MetaCodec(NS, WIRE, "writer-1", 2, other_key)
        assert CODEC.decode(forger.encode("t/b/01", SUMS, {}), "t/b/01") is MetaFault.FORGED


def test_a_partial_block_meta_verifies_with_its_fields() -> None:
    raw = CODEC.encode("t/r/ab", SUMS, {"tokens": 3, "expires": 1234.5})
    assert CODEC.decode(raw, "t/r/ab") == BlockMeta(sums=SUMS, tokens=3, expires=1234.5)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("sums", [digest_bytes("sha256", b"other").hex(), SUMS[1].hex()]),
        ("tokens", 4),
        ("expires", 1e12),
        ("writer", "writer-2"),
        ("mac", "00" * 32),
        ("mac", None),
    ],
)
def test_any_altered_field_fails_the_mac(field: str, value: object) -> None:
    meta = json.loads(CODEC.encode("t/r/ab", SUMS, {"tokens": 3, "expires": 1234.5}))
    meta[field] = value
    if value is None:
        del meta[field]
    assert CODEC.decode(json.dumps(meta).encode(), "t/r/ab") is MetaFault.FORGED


@pytest.mark.parametrize(
    "alter",
    [
        lambda m: m.update(v=1),
        lambda m: m.update(ns="kvs2|sha256|other@0|float32|bt4|x"),
        lambda m: m.update(wire="L3"),
        lambda m: m.update(sums=m["sums"][:1]),
        lambda m: m.update(sums=[s[:8] for s in m["sums"]]),
        lambda m: m.pop("sums"),
    ],
)
def test_metas_of_another_format_are_bad(alter: Callable[[dict[str, Any]], object]) -> None:
    meta = json.loads(CODEC.encode("t/b/01", SUMS, {}))
    alter(meta)
    assert CODEC.decode(json.dumps(meta).encode(), "t/b/01") is MetaFault.BAD
    assert CODEC.decode(b"\xff not json", "t/b/01") is MetaFault.BAD


def test_the_keyring_follows_the_secret_and_the_algorithm() -> None:
    """Workers and the router take their pool keys from ``ClusterConfig.keyring``."""
    from proto.registry import ClusterConfig

    assert ClusterConfig(cluster_secret="s" * 64, hash_algorithm="xxh3").keyring.algorithm == "xxh3"
    one, other = (ClusterConfig(cluster_secret=c * 64).keyring for c in "st")
    assert one.prefix_root != other.prefix_root and one.pool_block != other.pool_block
    assert one.prefix_root != one.pool_block  # one key per purpose

"""``bench hashing`` without a model: its baseline is the old chain, its rows are complete."""

from __future__ import annotations

import argparse

from kvserve.bench.hashing import HashingConfig, chain_costs, digest_costs, legacy_chain
from kvserve.settings import add_config_args


def test_the_baseline_is_hash_version_1() -> None:
    """The golden values the version 1 chain was pinned to (its namespace seed included)."""
    assert legacy_chain([1, 2, 3, 4, 5, 6, 7, 8, 9], 4, 0xB1ACE285E60AF083) == [
        0x7FB7BB83FB66E8E8,
        0x6C2DD80BCB766D3D,
    ]


def test_rows_cover_every_algorithm_block_size_and_shape() -> None:
    parser = argparse.ArgumentParser()
    add_config_args(parser, HashingConfig)
    args = parser.parse_args(["--repeat", "1", "--block-tokens", "4", "16"])
    chains = chain_costs(args, list(range(64)))
    assert [(r["algorithm"], r["block_tokens"]) for r in chains] == [
        (algorithm, bt)
        for bt in (4, 16)
        for algorithm in ("legacy-xxh3-64 (unkeyed, v1)", "sha256", "xxh3")
    ]
    assert all(r["us"] > 0 for r in chains)
    digests = digest_costs(args, {"small": (2, 1, 8)})
    assert [(r["model"], r["algorithm"]) for r in digests] == [
        ("small", "sha256"),
        ("small", "xxh3"),
    ]
    span = 2 * 64 * 1 * 8 * 4  # K and V of a 64-token block, 1 head of 8 floats
    assert all(r["kv_bytes"] == 2 * 16 * span for r in digests)  # 2 layers x 16 blocks

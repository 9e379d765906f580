"""``kvserve bench trace`` against a real mooncake_master (a fresh one per replay, loopback).

Uses the first 200 requests of the Mooncake trace the project ships."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from kvserve.bench.trace import run as trace
from kvserve.bench.trace.pool import PoolReplaySettings, pool_replay
from kvserve.loadgen.mooncake_trace import SHIPPED
from kvserve.settings import add_config_args
from kvserve.sim.trace.replay import (
    TraceRequest,
    block_chain,
    load_trace,
    lru_replay,
)

TRACE = SHIPPED
REQUESTS = 200


@pytest.fixture(scope="module")
def head() -> tuple[list[TraceRequest], list[list[int]]]:
    requests = load_trace(TRACE, REQUESTS)
    return requests, [block_chain(r.hash_ids) for r in requests]


def test_pool_equals_lru_when_nothing_is_evicted(
    head: tuple[list[TraceRequest], list[list[int]]], tmp_path: Path
) -> None:
    requests, chains = head
    distinct = len({h for c in chains for h in c})
    capacity = 2 * distinct  # under the eviction watermark all the way
    settings = PoolReplaySettings(block_bytes=4096)
    replay = pool_replay(requests, chains, capacity, settings, tmp_path)
    lru, cache = lru_replay(requests, chains, capacity)
    assert cache.evictions == 0
    assert replay.hits == lru
    assert replay.hits.hit_blocks > 0
    assert replay.put_failed_blocks == 0
    assert replay.stats.evicted_keys == 0
    assert replay.stats.key_count == distinct


def test_small_pool_evicts_and_hits_no_more_than_unbounded(
    head: tuple[list[TraceRequest], list[list[int]]], tmp_path: Path
) -> None:
    requests, chains = head
    settings = PoolReplaySettings(block_bytes=65536, layers=1)  # 16 MiB: 128 blocks
    replay = pool_replay(requests, chains, 100, settings, tmp_path)
    unbounded, _ = lru_replay(requests, chains, 1 << 40)
    blocks = sum(map(len, chains))
    assert replay.row(settings)["pool_capacity_blocks"] == 128
    assert replay.hits.blocks == blocks
    assert replay.hits.hit_tokens <= unbounded.hit_tokens
    assert replay.put_objects >= 2 * (blocks - unbounded.hit_blocks) - 2 * replay.put_failed_blocks
    assert replay.stats.evicted_keys > 0
    assert replay.stats.key_count <= 2 * 128


def test_chain_eviction_is_exactly_the_leaf_first_lru(
    head: tuple[list[TraceRequest], list[list[int]]], tmp_path: Path
) -> None:
    requests, chains = head
    capacity = 150  # about a tenth of the blocks: evictions all along
    settings = PoolReplaySettings(block_bytes=4096, eviction="chain")
    replay = pool_replay(requests, chains, capacity, settings, tmp_path)
    leaf, _ = lru_replay(requests, chains, capacity, leaf_first=True)
    lru, _ = lru_replay(requests, chains, capacity)
    assert replay.hits == leaf  # the same blocks, request by request in sum
    assert replay.hits.hit_tokens >= lru.hit_tokens > 0
    assert replay.put_failed_blocks == 0 and replay.stats.evicted_keys == 0  # not the master
    assert replay.chain is not None
    assert replay.chain["budget_blocks"] == capacity
    longest = max(map(len, chains))  # a claim never evicts its own blocks
    assert capacity <= replay.chain["peak_indexed_blocks"] <= capacity + longest
    assert replay.chain["evicted_blocks"] > 0
    assert replay.stats.key_count == replay.chain["indexed_blocks_end"]


def test_cli_prints_one_json_object(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    add_config_args(parser, trace.TraceBenchConfig)
    flags = "--max-requests 60 --capacities 300 20000 --workers 2 --block-bytes 4096"
    args = parser.parse_args(
        ["--trace", str(TRACE), *flags.split(), "--out", str(tmp_path / "plots")]
    )
    assert trace.run(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"bench", "conditions", "results", "headline"}
    assert out["bench"] == "trace" and out["conditions"]["requests"] == 60
    sections = [r["section"] for r in out["results"]]
    assert sections == ["ceiling", "capacity", "capacity"] + ["cluster"] * 12 + [
        "policy_worst"
    ] * len(trace.POLICIES)
    small, top = out["results"][1:3]
    for name in ("pool", "pool_chain", "leaf_lru"):
        assert top[name]["token_hit_rate"] == top["lru"]["token_hit_rate"]  # nothing evicted
    assert small["pool_chain"]["token_hit_rate"] == small["leaf_lru"]["token_hit_rate"]
    assert out["headline"]["pool"] == "pool_chain"
    worst = min(small["pool_chain_vs_lru_tokens"], top["pool_chain_vs_lru_tokens"])
    assert out["headline"]["ratio"] == worst

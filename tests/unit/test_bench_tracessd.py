"""The SSD-tier replay's bookkeeping (the replay itself needs a pool: docs/benchmarks.md 4.2)."""

from __future__ import annotations

import dataclasses

import pytest

from kvpool.tiers import HEARTBEAT_VARIABLE as HEARTBEAT
from kvserve.bench.trace.ssd import TierLoads, offload_retries, ssd_headline, working_set


def test_working_set_counts_distinct_blocks() -> None:
    assert working_set([[1, 2, 3], [1, 2, 4], []]) == 4


def test_tier_loads_sample_per_block_per_batch() -> None:
    loads = TierLoads()
    before = dataclasses.replace(loads.tiers)
    loads.tiers.ssd_objects += 4
    loads.tiers.ssd_read_seconds += 0.008
    loads.add(before, objects_per_block=2)  # 2 blocks in 8 ms: 4 ms a block
    before = dataclasses.replace(loads.tiers)
    loads.tiers.dram_objects += 1
    loads.tiers.dram_read_seconds += 0.0001
    loads.add(before, objects_per_block=1)
    row = loads.row()
    assert row["ssd_block_load_us_p50"] == 4000 and row["ssd_batches"] == 1
    assert row["dram_block_load_us_p50"] == 100 and row["dram_objects_read"] == 1


def test_headline_compares_dram_plus_ssd_with_dram_only() -> None:
    rows = [
        {"section": "ssd", "tiers": t, "token_hit_rate": r, "dram_block_load_us_p50": 10,
         "ssd_block_load_us_p50": s}
        for t, r, s in (("dram", 0.1, None), ("dram+ssd", 0.3, 200))
    ]  # fmt: skip
    head = ssd_headline(rows)
    assert head["ratio"] == 3.0 and head["ssd_block_load_us_p50"] == 200


def test_puts_retry_through_two_offload_heartbeats(monkeypatch: pytest.MonkeyPatch) -> None:
    """5 ms doubling: 9 retries wait 2.555 s in all, over two 1 s heartbeats (8: 1.275 s)."""
    monkeypatch.delenv(HEARTBEAT, raising=False)
    assert offload_retries(5) == 9 and offload_retries(12) == 12
    monkeypatch.setenv(HEARTBEAT, "10")  # Mooncake's own default
    assert offload_retries(5) == 12  # 20.475 s (11: 10.235 s)

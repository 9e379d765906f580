"""The SSD tier's settings, the master's offload flags, and what a full DRAM tier means to
the store's breaker (no pool needed: the real pool is in tests/integration/test_pool_ssd.py)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import pytest

from kvpool.config import PoolConfig
from kvpool.master import MasterConfig
from kvpool.store import MooncakeStore
from kvpool.tiers import (
    BUFFER_VARIABLE,
    NO_SPACE,
    Tier,
    TierStats,
    prepare_ssd_dir,
    receive_by_tier,
)
from kvserve import cli
from kvserve.cluster.pool import master_command
from kvserve.cluster.spec import ClusterSpec
from kvserve.cluster.up_settings import spec_from_args


def test_pool_ssd_dir_must_be_absolute() -> None:
    assert PoolConfig().pool_ssd_dir == ""
    assert PoolConfig(pool_ssd_dir="/var/kv/ssd").pool_ssd_dir == "/var/kv/ssd"
    with pytest.raises(ValueError, match="absolute"):
        PoolConfig(pool_ssd_dir="kv/ssd")
    with pytest.raises(ValueError, match="without"):
        PoolConfig(pool_ssd_dir="/var/kv/../ssd")


def test_master_offload_flags() -> None:
    assert not any("offload" in a or "promotion" in a for a in master_command(MasterConfig()))
    on = MasterConfig(master_enable_offload=True)
    assert "--enable_offload=true" in master_command(on)
    assert "--offload_on_evict=true" not in master_command(on)
    lazy = MasterConfig(
        master_enable_offload=True, master_offload_on_evict=True, master_promotion_on_hit=True
    )
    assert {"--offload_on_evict=true", "--promotion_on_hit=true"} <= set(master_command(lazy))
    with pytest.raises(ValueError, match="master_enable_offload"):
        MasterConfig(master_offload_on_evict=True)
    with pytest.raises(ValueError, match="master_enable_offload"):
        MasterConfig(master_promotion_on_hit=True)


def test_up_gives_each_worker_its_own_ssd_dir_and_the_master_offload() -> None:
    args = cli.build_parser().parse_args(
        ["up", "--prefill", "1", "--decode", "1", "--pool-ssd-dir", "/srv/kv"]
    )
    spec = spec_from_args(args)
    assert spec.pool_config("prefill-0").pool_ssd_dir == "/srv/kv/prefill-0"
    assert spec.pool_config("decode-0").pool_ssd_dir == "/srv/kv/decode-0"
    assert spec.pool_config("router").pool_ssd_dir == ""
    assert spec.pool_master.master_enable_offload
    assert "--enable_offload=true" in master_command(spec.pool_master)
    assert not ClusterSpec().pool_master.master_enable_offload


def test_ssd_dir_is_made_and_a_bad_one_is_named(tmp_path: Path) -> None:
    made = tmp_path / "a" / "b"
    assert prepare_ssd_dir(str(made)) == str(made.resolve()) and made.is_dir()
    link = tmp_path / "link"
    link.symlink_to(made)
    assert prepare_ssd_dir(str(link)) == str(made.resolve())  # Mooncake refuses symlinks
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(OSError, match="pool_ssd_dir"):
        prepare_ssd_dir(str(blocker / "ssd"))


class UnhealthyClient:
    """A binding whose puts answer ``code`` and whose health check says the master is
    gone (as it may while the master evicts and offloads under load)."""

    def __init__(self, code: int) -> None:
        self.code = code

    def batch_put_from(self, keys: list[str], ptrs: list[int], sizes: list[int]) -> list[int]:
        return [self.code] * len(keys)

    def health_check(self) -> int:
        return 1


def test_no_space_is_a_failed_put_not_an_outage() -> None:
    store = MooncakeStore(UnhealthyClient(NO_SPACE))
    assert store.put_from(["a", "b"], [0, 0], [1, 1]) == [NO_SPACE, NO_SPACE]
    assert store.outages == 0 and store.available
    broken = MooncakeStore(UnhealthyClient(-1))
    assert not broken.breaker_open
    broken.put_from(["a"], [0], [1])
    assert broken.outages == 1 and not broken.available and broken.breaker_open


class Got(NamedTuple):
    nbytes: int
    key: str


def test_receive_by_tier_keeps_order_and_counts_each_tier() -> None:
    calls: list[list[str]] = []

    def receive(keys: list[str], spans: list[int]) -> Sequence[Got]:
        calls.append(keys)
        return [Got(-1 if k == "gone" else 4, k) for k in keys]

    keys = ["d0", "s0", "gone", "d1", "s1"]
    tiers = [Tier.DRAM, Tier.SSD, Tier.NONE, Tier.DRAM, Tier.SSD]
    stats = TierStats()
    got = receive_by_tier(receive, tiers, keys, list(range(5)), 4, stats)
    assert [g.key for g in got] == keys
    assert calls == [["s0", "s1"], ["d0", "gone", "d1"]]
    assert (stats.ssd_objects, stats.dram_objects) == (2, 2)


def test_ssd_reads_fit_half_the_offload_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(BUFFER_VARIABLE, "16")  # 2 objects of 4 bytes a batch
    calls: list[list[str]] = []

    def receive(keys: list[str], spans: list[int]) -> Sequence[Got]:
        calls.append(keys)
        return [Got(4, k) for k in keys]

    keys = ["s0", "d0", "s1", "s2", "s3", "s4"]
    tiers = [Tier.SSD, Tier.DRAM, *[Tier.SSD] * 4]
    got = receive_by_tier(receive, tiers, keys, list(range(6)), 4, TierStats())
    assert [g.key for g in got] == keys
    assert calls == [["s0", "s1"], ["s2", "s3"], ["s4"], ["d0"]]


def test_tier_counts_reach_the_load_report() -> None:
    from workers.core.engine_info import EngineLoad, PoolHealth
    from workers.core.outputs import EngineStats
    from workers.serve.wire import load_report

    health = PoolHealth(connected=True, tiers=TierStats(3, 2, 0.25, 0.5))
    load = EngineLoad(0, 0, 0, 0, 1, 1, EngineStats(), health)
    report = load_report(load, "decode", False)
    assert (report.pool_dram_objects, report.pool_ssd_objects) == (3, 2)
    assert (report.pool_dram_read_seconds, report.pool_ssd_read_seconds) == (0.25, 0.5)

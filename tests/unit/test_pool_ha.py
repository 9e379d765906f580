"""HA pool masters (:mod:`kvserve.cluster.pool_ha`): the ports' layout, the commands, the
members' settings (``etcd://`` masters, P2P metadata, every master's metrics), the
leader's metrics read among several (real HTTP)."""

from __future__ import annotations

from collections.abc import Iterator
from http.server import ThreadingHTTPServer

import pytest

from kvpool.config import PoolConfig, etcd_endpoints
from kvpool.master import MasterConfig, master_stats_at
from kvserve.cluster.plan import plan_cluster
from kvserve.cluster.pool import master_command, pool_services
from kvserve.cluster.pool_ha import PoolHA, ha_ports_needed, ha_services, master_names
from tests.http_stub import text_server
from tests.unit.test_cluster_spec import flag, spec

PORTS = tuple(range(7001, 7009))


def test_the_ports_layout_and_the_address() -> None:
    assert ha_ports_needed(2) == 8 and ha_ports_needed(3) == 10
    ha = PoolHA.of(MasterConfig(), 2, PORTS)
    assert ha.etcd == ((7001, 7002), (7003, 7004), (7005, 7006))
    assert ha.masters == ((50051, 9003), (7007, 7008))
    assert ha.address == "etcd://127.0.0.1:7001;127.0.0.1:7003;127.0.0.1:7005"
    assert ha.metrics_urls == "http://127.0.0.1:9003/metrics,http://127.0.0.1:7008/metrics"
    assert master_names(3) == ["mooncake_master", "mooncake_master-1", "mooncake_master-2"]
    with pytest.raises(ValueError, match="need 8 ports"):
        PoolHA.of(MasterConfig(), 2, PORTS[:-1])


def test_each_master_runs_in_ha_mode_on_its_ports() -> None:
    from pathlib import Path

    ha = PoolHA.of(MasterConfig(), 2, PORTS)
    second = master_command(ha.master_config(MasterConfig(), 1))
    assert "--enable_ha=true" in second and "--rpc_port=7007" in second
    assert "--metrics_port=7008" in second
    assert "--etcd_endpoints=127.0.0.1:7001;127.0.0.1:7003;127.0.0.1:7005" in second
    services = ha_services(MasterConfig(), ha, Path("/d"))
    assert [s.name for s in services] == [
        "etcd-0", "etcd-1", "etcd-2", "mooncake_master", "mooncake_master-1",
    ]  # fmt: skip
    assert [s.ports for s in services] == [
        (7001, 7002),
        (7003, 7004),
        (7005, 7006),
        (9003,),
        (7008,),
    ]
    (alone,) = pool_services(ha.master_config(MasterConfig(), 1))  # one master, as kvserve pool
    assert services[-1].argv == alone.argv == tuple(second)
    etcd = ha.etcd_command(2, Path("/d"))
    assert "--name=etcd-2" in etcd and "--data-dir=/d/etcd-2" in etcd
    assert "--listen-client-urls=http://127.0.0.1:7005" in etcd
    assert (
        "--initial-cluster=etcd-0=http://127.0.0.1:7002,etcd-1=http://127.0.0.1:7004,"
        "etcd-2=http://127.0.0.1:7006" in etcd
    )


def test_members_address_ha_masters_through_etcd() -> None:
    s = spec(pool_masters=2, pool_ha_ports=PORTS)
    config = s.pool_config("decode-0")
    assert config.ha_master and config.pool_master.startswith("etcd://127.0.0.1:7001;")
    assert config.metadata_server == "P2PHANDSHAKE"
    assert config.master_metrics_url.count(",") == 1
    argv = plan_cluster(s, [0, 1]).routers[0].argv
    assert flag(argv, "--pool-master") == config.pool_master
    assert len(set(s.named_ports().values())) == len(s.named_ports())
    freed = spec(pool_masters=2, pool_ha_ports=PORTS).with_free_ports()
    assert len(freed.pool_ha_ports) == 8 and freed.pool_ha_ports != PORTS
    with pytest.raises(ValueError, match="8 ports for 2 masters"):
        spec(pool_masters=2, pool_ha_ports=PORTS[:4])
    with pytest.raises(ValueError, match="need use_pool"):
        spec(pool_masters=2, pool_ha_ports=PORTS, use_pool=False, prefill=0, decode=0, mixed=1)


def test_etcd_master_addresses_are_checked() -> None:
    assert etcd_endpoints("etcd://a:1;b:2") == [("a", 1), ("b", 2)]
    for bad in ("etcd://", "etcd://a", "etcd://a:x", "etcd://a:1;:2", "etcd://a:70000"):
        with pytest.raises(ValueError, match="etcd://HOST:PORT"):
            PoolConfig(pool_master=bad)
    assert PoolConfig(pool_master="etcd://a:1").metrics_url == ""


def _metrics(capacity: int) -> ThreadingHTTPServer:
    return text_server(f"master_total_capacity_bytes {capacity}\nmaster_key_count 3\n".encode())


@pytest.fixture
def masters() -> Iterator[list[str]]:
    servers = [_metrics(0), _metrics(4096)]  # a standby, the leader
    yield [f"http://127.0.0.1:{s.server_address[1]}/metrics" for s in servers]
    for s in servers:
        s.shutdown()
        s.server_close()


def test_the_leaders_metrics_are_read_among_several(masters: list[str]) -> None:
    from kvpool.net import free_local_ports

    (closed,) = free_local_ports(1)
    gone = f"http://127.0.0.1:{closed}/metrics"
    assert master_stats_at(",".join([gone, *masters]), 1.0).capacity_bytes == 4096
    with pytest.raises(OSError):
        master_stats_at(gone, 1.0)

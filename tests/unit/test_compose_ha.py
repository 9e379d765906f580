"""docker-compose.ha.yml over docker-compose.yml: two routers behind nginx, two pool masters
in HA mode over three etcd members; read as compose would (tests/unit/compose_files.py),
checked against the CLI and against what ``kvserve up --routers 2 --pool-masters 2`` runs
(the same nginx configuration, the same pool addresses). No container runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvpool.config import PoolConfig, etcd_endpoints
from kvpool.master import MasterConfig
from kvserve.cluster.balancer import nginx_conf
from kvserve.settings import config_from_args
from router.config import RouterConfig
from tests.unit.compose_files import HA_SERVICES, ROOT, environment, parse

ETCD = [f"etcd-{i}" for i in (1, 2, 3)]
ROUTERS = ("router", "router-2")
MASTERS = ("master", "master-2")


def test_every_member_addresses_the_masters_through_all_of_etcd(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("prefill", "decode", *ROUTERS):
        pool = config_from_args(PoolConfig, parse(HA_SERVICES[name], monkeypatch))
        assert pool.ha_master and pool.metadata_server == "P2PHANDSHAKE"
        assert [h for h, _ in etcd_endpoints(pool.pool_master)] == ETCD
        urls = pool.master_metrics_url.split(",")
        assert urls == [f"http://{m}:9003/metrics" for m in MASTERS]


def test_each_master_runs_in_ha_mode_on_its_own_name(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in MASTERS:
        service = HA_SERVICES[name]
        cfg = config_from_args(MasterConfig, parse(service, monkeypatch))
        assert cfg.master_host == name  # binds and advertises what the others resolve
        assert cfg.master_etcd_endpoints == ";".join(f"{e}:2379" for e in ETCD)
        assert "ports" not in service  # the pool authenticates nobody: never published
        assert set(ETCD) <= set(service["depends_on"])


def test_three_etcd_members_form_one_cluster() -> None:
    cluster = ",".join(f"{e}=http://{e}:2380" for e in ETCD)
    for name in ETCD:
        argv = HA_SERVICES[name]["command"]
        assert f"--name={name}" in argv and f"--initial-cluster={cluster}" in argv
        assert f"--advertise-client-urls=http://{name}:2379" in argv
        assert "ports" not in HA_SERVICES[name]


def test_nginx_alone_is_published_and_runs_the_balancers_configuration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The routers publish nothing; nginx publishes the API on loopback with the
    configuration ``kvserve up --routers`` uses (kvserve/cluster/balancer.py), over both
    routers where they listen; each router has its own id."""
    ids, upstreams = [], []
    for name in ROUTERS:
        assert "ports" not in HA_SERVICES[name]
        router = config_from_args(RouterConfig, parse(HA_SERVICES[name], monkeypatch))
        ids.append(router.router_id)
        upstreams.append(f"{name}:{router.router_port}")
    assert len(set(ids)) == 2
    nginx = HA_SERVICES["nginx"]
    assert nginx["ports"] == ["127.0.0.1:8000:8000"]
    (mount,) = nginx["volumes"]
    source, target, mode = mount.split(":")
    assert nginx["command"] == ["nginx", "-c", target] and mode == "ro"
    conf = (ROOT / source).read_text()
    assert conf == nginx_conf(Path("/tmp"), "0.0.0.0", 8000, upstreams)
    assert set(nginx["depends_on"]) == set(ROUTERS)


def test_the_api_is_still_where_the_base_file_has_it() -> None:
    from tests.unit.compose_files import SERVICES

    assert SERVICES["router"]["ports"] == HA_SERVICES["nginx"]["ports"]
    assert environment(HA_SERVICES["router-2"])["KVSERVE_ROUTER_PORT"] == "8000"

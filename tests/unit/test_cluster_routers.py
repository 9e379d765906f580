"""Several routers in a ClusterSpec (``router_ports``): names, ports, each router's argv,
the balancer, hosts, validation (pure); ``kvserve up --routers``."""

from __future__ import annotations

import pytest

from kvserve.cluster.host import Host
from kvserve.cluster.plan import plan_cluster
from kvserve.cluster.router_names import host_group, is_router, router_names
from tests.unit.test_cluster_spec import flag, spec


def test_router_names() -> None:
    assert router_names(()) == ["router"]
    assert router_names((8001, 8002)) == ["router-0", "router-1"]
    assert is_router("router") and is_router("router-12")
    assert not is_router("router-") and not is_router("router-a") and not is_router("balancer")
    assert host_group("router-1") == host_group("balancer") == "router"
    assert host_group("decode-0") == "decode-0"


def test_two_routers_each_on_its_port_behind_the_balancer() -> None:
    s = spec(router_ports=(8001, 8002))
    plan = plan_cluster(s, [0, 1])
    assert [r.name for r in plan.routers] == ["router-0", "router-1"]
    assert plan.router is plan.routers[0]
    for router, port in zip(plan.routers, ("8001", "8002"), strict=True):
        assert flag(router.argv, "--router-port") == port
        assert flag(router.argv, "--router-id") == router.name
        assert router.role == "router" and router.cores == ()
        assert flag(router.argv, "--pool-local-hostname") == "127.0.0.1"
    named = s.named_ports()
    assert named["balancer"] == 8000 and "router" not in named
    assert (named["router-0"], named["router-1"]) == (8001, 8002)
    assert s.router_url == "http://127.0.0.1:8000"  # clients: the balancer
    assert {r.name: f"http://{r.address}" for r in plan.routers} == {
        "router-0": "http://127.0.0.1:8001",
        "router-1": "http://127.0.0.1:8002",
    }
    assert s.process_names()[-3:] == ["router-0", "router-1", "balancer"]


def test_one_router_is_router_on_router_port() -> None:
    s = spec()
    (router,) = plan_cluster(s, [0, 1]).routers
    assert (router.name, router.port, flag(router.argv, "--router-id")) == (
        "router",
        8000,
        "router",
    )
    assert f"http://{router.address}" == s.router_url == "http://127.0.0.1:8000"
    assert "balancer" not in s.process_names()


def test_routers_and_the_balancer_run_on_the_routers_host() -> None:
    s = spec(router_ports=(8001, 8002), hosts={"router": Host("10.9.0.5", ("ns", "r"))})
    for router in plan_cluster(s, [0, 1]).routers:
        assert (router.host, router.prefix) == ("10.9.0.5", ("ns", "r"))
        assert flag(router.argv, "--pool-local-hostname") == "10.9.0.5"
    assert s.host_of("balancer") == "10.9.0.5" and s.router_url == "http://10.9.0.5:8000"


def test_free_ports_cover_every_router() -> None:
    s = spec(router_ports=(1, 2, 3)).with_free_ports()
    ports = list(s.named_ports().values())
    assert len(s.router_ports) == 3 and len(set(ports)) == len(ports)


@pytest.mark.parametrize(
    ("ports", "why"),
    [((8001,), "at least 2"), ((8001, 8001), "distinct"), ((8000, 8001), "distinct")],
)
def test_router_ports_are_validated(ports: tuple[int, ...], why: str) -> None:
    with pytest.raises(ValueError, match=why):
        spec(router_ports=ports)

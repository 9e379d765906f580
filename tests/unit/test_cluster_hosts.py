"""ClusterSpec.hosts: processes placed on hosts of their own (addresses, prefixes), and
what may be placed where (pure)."""

from __future__ import annotations

import pytest

from kvserve.cluster.host import Host
from kvserve.cluster.plan import plan_cluster
from tests.unit.test_cluster_spec import flag, spec


def test_hosts_place_each_process_on_its_own_address_and_prefix() -> None:
    """Each placed process binds to, advertises and is reached at its own address, and
    starts under its prefix; the pool's services move together; the rest stay on host."""
    hosts = {
        "mooncake_master": Host("10.9.0.2", ("ns", "m")),
        "redis": Host("10.9.0.3"),
        "decode-0": Host("10.9.0.4", ("ns", "d")),
        "router": Host("10.9.0.5", ("ns", "r")),
    }
    s = spec(hosts=hosts, redis_password="pw")
    plan = plan_cluster(s, [0, 1])
    prefill, decode = plan.workers
    assert (prefill.host, prefill.prefix) == ("127.0.0.1", ())
    assert (decode.address, decode.prefix) == ("10.9.0.4:50062", ("ns", "d"))
    assert flag(decode.argv, "--worker-host") == "10.9.0.4"
    assert flag(decode.argv, "--pool-local-hostname") == "10.9.0.4"
    assert flag(decode.argv, "--pool-master") == "10.9.0.2:50051"
    assert flag(decode.argv, "--pool-metadata-server") == "http://10.9.0.2:8080/metadata"
    assert flag(decode.argv, "--redis-url") == "redis://10.9.0.3:6379/0"
    assert flag(prefill.argv, "--pool-local-hostname") == "127.0.0.1"
    assert (plan.router.host, plan.router.prefix) == ("10.9.0.5", ("ns", "r"))
    assert flag(plan.router.argv, "--router-host") == "10.9.0.5"
    assert flag(plan.router.argv, "--pool-local-hostname") == "10.9.0.5"
    assert flag(plan.router.argv, "--master-metrics-url") == "http://10.9.0.2:9003/metrics"
    assert s.router_url == "http://10.9.0.5:8000"
    assert s.pool_master.master_host == "10.9.0.2" and s.redis_config.host == "10.9.0.3"
    assert s.prefix_of("mooncake_master") == ("ns", "m") and s.prefix_of("redis") == ()


@pytest.mark.parametrize(
    ("hosts", "error"),
    [
        ({"decode-7": Host("10.9.0.4")}, "not in"),
        ({"router": Host("0.0.0.0")}, "router must be an address"),
        ({"redis": Host("")}, "redis must be an address"),
        ({"redis": Host("10.9.0.3")}, "reachable from other hosts: set a password"),
    ],
)
def test_hosts_must_name_real_processes_and_reachable_addresses(
    hosts: dict[str, Host], error: str
) -> None:
    with pytest.raises(ValueError, match=error):
        spec(hosts=hosts, redis_password="")

"""The pure part of :mod:`kvserve.netns` and ``kvserve up --hosts``: who gets which address,
namespace and link name (the namespaces themselves are made in
tests/e2e/test_disaggregated.py)."""

from __future__ import annotations

import pytest

import kvserve.cli as cli
from kvserve.netns import NetHosts
from kvserve.up import spec_from_args


def test_up_hosts_puts_every_process_on_its_own_address() -> None:
    args = cli.build_parser().parse_args(
        ["up", "--hosts", "--hosts-subnet", "10.77.0.0/28", "--hosts-tag", "kvq", "--decode", "2"]
    )
    spec = spec_from_args(args)
    net = NetHosts.for_spec(spec, args.hosts_subnet, args.hosts_tag)
    placed = net.place(spec)
    names = ["mooncake_master", "redis", "prefill-0", "decode-0", "decode-1", "router"]
    assert net.gateway == "10.77.0.1"
    assert {n: placed.host_of(n) for n in names} == {
        n: f"10.77.0.{i}" for i, n in enumerate(names, start=2)
    }
    assert placed.prefix_of("decode-1") == ("ip", "netns", "exec", "kvq-decode-1")
    assert placed.redis_password and spec.redis_password == ""  # made up for the run
    assert net.place(placed).redis_password == placed.redis_password  # a given one is kept
    assert placed.router_url == "http://10.77.0.7:8000"


def test_link_names_fit_linux_limits() -> None:
    net = NetHosts([f"w{i}" for i in range(40)], "10.0.0.0/24", "abcdefgh")
    assert max(len(n) for n in (net.bridge, *net._veth.values())) <= 15
    assert len({*net._veth.values()}) == 40


@pytest.mark.parametrize(
    ("names", "subnet", "tag", "error"),
    [
        (["a"], "10.0.0.0/24", "Bad", "tag must be"),
        (["a"], "10.0.0.0/24", "waytoolongtag", "tag must be"),
        (["a", "a"], "10.0.0.0/24", "kv", "distinct"),
        (["a b"], "10.0.0.0/24", "kv", "distinct words"),
        (["a", "b", "c"], "10.0.0.0/30", "kv", "too few addresses"),
        (["a"], "fd00::/64", "kv", "IPv4"),
    ],
)
def test_bad_plans_are_refused(names: list[str], subnet: str, tag: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        NetHosts(names, subnet, tag)

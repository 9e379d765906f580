"""The ``redis+sentinel://`` form of ``redis_url`` (proto.sentinel), parsed exactly."""

from __future__ import annotations

import pytest

from proto.registry import ClusterConfig
from proto.sentinel import SentinelURL


def test_hosts_service_and_database_are_parsed() -> None:
    url = SentinelURL.parse("redis+sentinel://10.0.0.1:26379,[::1]:26380,sentinel-c:1/kvs/2")
    assert url.sentinels == (("10.0.0.1", 26379), ("::1", 26380), ("sentinel-c", 1))
    assert (url.service, url.db) == ("kvs", 2)
    assert SentinelURL.parse("redis+sentinel://h:5/kvs").db == 0
    assert str(SentinelURL.parse("redis+sentinel://h:5/kvs")) == "redis+sentinel://h:5/kvs/0"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+sentinel://h:5", "service"),
        ("redis+sentinel://h:5/", "service"),
        ("redis+sentinel://h/kvs", "HOST:PORT"),
        ("redis+sentinel://h:0/kvs", "HOST:PORT"),
        ("redis+sentinel://h:70000/kvs", "HOST:PORT"),
        ("redis+sentinel://h:5,/kvs", "HOST:PORT"),
        ("redis+sentinel://h:5/kvs/x", "number"),
        ("redis+sentinel://user:pw@h:5/kvs", "no credentials"),
        ("redis+sentinel://h:5/kvs?ssl=1", "no credentials"),
    ],
)
def test_malformed_urls_are_refused_naming_the_fault(url: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        SentinelURL.parse(url)
    with pytest.raises(ValueError, match=says):
        ClusterConfig(redis_url=url)


def test_the_cluster_config_takes_a_sentinel_url_and_credentials_beside_it() -> None:
    config = ClusterConfig(redis_url="redis+sentinel://h:5/kvs", redis_password="pw")
    assert config.redis_where == "redis+sentinel://h:5/kvs"
    with pytest.raises(ValueError, match="redis:// \\(or redis\\+sentinel://\\)"):
        ClusterConfig(redis_url="http://h:5")

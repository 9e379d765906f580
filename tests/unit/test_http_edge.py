"""The HTTP edge's Host and Content-Type rules (router.api.edge), exactly."""

from __future__ import annotations

import pytest

from router.api.edge import LOOPBACK_NAMES, host_name, require_json, served_hosts
from router.config import RouterConfig
from router.errors import APIError


@pytest.mark.parametrize(
    ("value", "name"),
    [
        ("127.0.0.1:8000", "127.0.0.1"),
        ("LocalHost", "localhost"),
        ("example.com.", "example.com"),
        ("[::1]:8000", "::1"),
        ("[::1]", "::1"),
        (" router-1:8000 ", "router-1"),
        (None, None),
        ("", None),
        ("a b", None),
        ("host:port", None),
        ("host:123456", None),
        ("[::1]x", None),
        ("evil/x:80", None),
        ("a@b", None),
    ],
)
def test_the_name_in_a_host_header(value: str | None, name: str | None) -> None:
    assert host_name(value) == name


def test_served_hosts() -> None:
    assert served_hosts("127.0.0.1", "") == LOOPBACK_NAMES
    assert served_hosts("10.0.0.5", "") == LOOPBACK_NAMES | {"10.0.0.5"}
    assert served_hosts("[fd00::5]", "") == LOOPBACK_NAMES | {"fd00::5"}
    assert served_hosts("127.0.0.1", " api.example.com , 10.1.2.3") == LOOPBACK_NAMES | {
        "api.example.com",
        "10.1.2.3",
    }
    for wildcard in ("0.0.0.0", "::"):
        assert served_hosts(wildcard, "") is None  # its names are unknown: any
        assert served_hosts(wildcard, "api.example.com") == LOOPBACK_NAMES | {"api.example.com"}
    assert served_hosts("127.0.0.1", "*") is None


def test_allowed_hosts_are_checked_as_a_setting() -> None:
    assert RouterConfig(allowed_hosts="a.example,[::1]").served_hosts is not None
    with pytest.raises(ValueError, match="allowed_hosts entry 2"):
        RouterConfig(allowed_hosts="a.example,http://b.example/")


@pytest.mark.parametrize(
    "content_type", ["application/json", "Application/JSON", "application/json; charset=utf-8"]
)
def test_json_bodies_are_read(content_type: str) -> None:
    require_json(content_type)


@pytest.mark.parametrize(
    "content_type",
    [None, "", "text/plain", "application/jsonx", "text/json", "multipart/form-data"],
)
def test_other_bodies_are_refused_with_415(content_type: str | None) -> None:
    with pytest.raises(APIError) as refused:
        require_json(content_type)
    assert (refused.value.status, refused.value.code) == (415, "unsupported_media_type")

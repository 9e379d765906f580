"""The compose Prometheus's sign-in (issue 38, finding 9) against a real Prometheus (Debian's,
tests/prometheus.py): started with the ``--web.config.file`` deploy/init_secrets.py writes, it
refuses a request without credentials or with a wrong password, and answers the login
Grafana's data source and its own health check use (tests/unit/compose_files.py reads each
from where its reader finds it)."""

from __future__ import annotations

import base64
import subprocess
import urllib.error
from pathlib import Path

import pytest

from tests.prometheus import Prometheus
from tests.unit.compose_files import init_secrets, prometheus_login


def basic(user: bytes, password: bytes) -> str:
    return "Basic " + base64.b64encode(user + b":" + password).decode()


def status(prom: Prometheus, authorization: str) -> int:
    try:
        with prom.get("/-/ready", authorization) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as refused:
        return refused.code


def test_prometheus_answers_only_the_reader(tmp_path: Path) -> None:
    init_secrets().write(tmp_path / "secrets", {})
    login = prometheus_login(tmp_path / "secrets")
    web = tmp_path / "secrets/prometheus/web.yml"
    checked = subprocess.run(["promtool", "check", "web-config", str(web)], capture_output=True)
    assert checked.returncode == 0, checked.stderr
    grafana = basic(login["user"].encode(), login["password"])
    config = {"global": {"scrape_interval": "1s"}, "scrape_configs": []}
    with Prometheus(config, tmp_path, web_config=web, authorization=grafana) as prom:
        assert status(prom, grafana) == 200 and prom.query("vector(1)")
        assert status(prom, "Basic " + login["health"]) == 200  # the health check's
        assert status(prom, "") == 401
        assert status(prom, basic(login["user"].encode(), b"wrong")) == 401
        assert status(prom, basic(b"admin", login["password"])) == 401


@pytest.mark.parametrize("given", ["", "chosen-reader-password"])
def test_the_reader_password_is_kept_and_a_given_one_wins(tmp_path: Path, given: str) -> None:
    module = init_secrets()
    module.write(tmp_path, {})
    first = prometheus_login(tmp_path)
    module.write(tmp_path, {"KVSERVE_PROMETHEUS_PASSWORD": given} if given else {})
    second = prometheus_login(tmp_path)
    assert (second == first) == (not given)
    if given:
        assert second["password"] == given.encode() and second["hash"] != first["hash"]

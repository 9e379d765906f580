"""The Grafana dashboard and its provisioning are consistent: the compose ``grafana``
service mounts what the provider reads, every panel queries the provisioned data source,
and every query uses only Grafana's own variables. (Whether each query returns data from a
live cluster: tests/e2e/test_dashboard.py.)"""

from __future__ import annotations

import re

import yaml  # type: ignore[import-untyped, unused-ignore]

from tests.dashboard import GRAFANA, VARIABLES, dashboard, panels, queries
from tests.unit.compose_files import SERVICES, mounts


def test_compose_provisions_the_dashboard_and_the_data_source() -> None:
    grafana = SERVICES["grafana"]
    assert grafana["profiles"] == ["monitoring"] == SERVICES["prometheus"]["profiles"]
    mounted = mounts(grafana)
    assert mounted["/etc/grafana/provisioning"] == ("./deploy/grafana/provisioning", "ro")
    provider = yaml.safe_load((GRAFANA / "provisioning/dashboards/kvserve.yml").read_text())
    (source,) = provider["providers"]
    assert mounted[source["options"]["path"]] == ("./deploy/grafana/dashboards", "ro")
    datasources = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yml").read_text())
    (prometheus,) = datasources["datasources"]
    assert prometheus["url"] == "http://prometheus:9090" and prometheus["type"] == "prometheus"
    assert "127.0.0.1:9090:9090" in SERVICES["prometheus"]["ports"]
    for panel in panels():
        for holder in (panel, *panel["targets"]):
            assert holder["datasource"] == {"type": "prometheus", "uid": prometheus["uid"]}


def test_panels_are_distinct_and_queries_use_only_grafana_variables() -> None:
    ids = [p["id"] for p in dashboard()["panels"]]
    assert len(ids) == len(set(ids)) and dashboard()["uid"]
    titles = [p["title"] for p in panels()]
    assert len(titles) == len(set(titles)) >= 16
    for query in queries():
        assert set(re.findall(r"\$\w+", query.expr)) <= set(VARIABLES), query
        assert "$" not in query.at("5m")

"""The Grafana dashboard shipped in deploy/ (provisioned by the compose ``monitoring``
profile) as the tests read it: every panel's PromQL, with Grafana's variables filled."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "kvserve.json"
VARIABLES = ("$__rate_interval", "$__interval", "$__range")
"""The only variables the dashboard's queries may use (it has no template variables)."""


class Query(NamedTuple):
    panel: str
    ref: str
    expr: str

    def at(self, window: str) -> str:
        """The PromQL with every Grafana variable replaced by ``window`` (e.g. ``5m``)."""
        expr = self.expr
        for variable in VARIABLES:
            expr = expr.replace(variable, window)
        return expr


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def panels() -> list[dict[str, Any]]:
    """Every panel but the rows."""
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def queries() -> list[Query]:
    """Every target of every panel."""
    return [Query(p["title"], t["refId"], t["expr"]) for p in panels() for t in p["targets"]]

"""``kvserve bench compare`` over deployments and router policies: one fresh run per pair,
rows keyed by both, the headline the first run against the second (the runs faked)."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest

from kvserve.bench import compare
from kvserve.cli import build_parser
from kvserve.loadgen.slo import SweepGoodput
from workers.config import EngineConfig


def parse(argv: list[str]) -> argparse.Namespace:
    return build_parser("bench").parse_args(["bench", "compare", *argv])


def test_policies_are_a_list_and_policy_names_one() -> None:
    assert parse([]).policies == ["cache_aware"]
    assert parse(["--policies", "round_robin", "cache_aware"]).policies == [
        "round_robin",
        "cache_aware",
    ]
    assert parse(["--policy", "least_loaded"]).policies == ["least_loaded"]
    with pytest.raises(SystemExit):
        parse(["--policies", "nearest"])


def test_every_deployment_runs_under_every_policy(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    started: list[tuple[str, str]] = []
    goodputs = {
        ("2m", "round_robin"): 1.0,
        ("2m", "cache_aware"): 2.0,
        ("1p1d", "round_robin"): 3.0,
    }

    def fake_run(
        args: argparse.Namespace, name: str, engine: EngineConfig, policy: str
    ) -> dict[str, Any]:
        started.append((name, policy))
        rate = goodputs.get((name, policy), 4.0)
        sweep = SweepGoodput(0.9, rate, rate)
        return {
            "conditions": {"url": "u", "deployment": {}, "workload": "conversation"},
            "rows": [{"rate": rate}],
            "sweep": sweep,
            "runs": [],
            "points": [(rate, 1.0)],
            "placement": {"shared_cores": False, "workers": {}},
        }

    monkeypatch.setattr(compare, "run_deployment", fake_run)
    args = parse(
        ["--deployments", "2m", "1p1d", "--policies", "round_robin", "cache_aware",
         "--slo-ttft-s", "5", "--workload", "conversation"]
    )  # fmt: skip
    assert compare.run(args) == 0
    out = json.loads(capsys.readouterr().out)
    pairs = [
        ("2m", "round_robin"),
        ("2m", "cache_aware"),
        ("1p1d", "round_robin"),
        ("1p1d", "cache_aware"),
    ]
    assert started == pairs
    assert [(r["deployment"], r["policy"]) for r in out["results"]] == pairs
    assert [r["goodput_rps"] for r in out["results"]] == [1.0, 2.0, 3.0, 4.0]
    assert out["conditions"]["policies"] == ["round_robin", "cache_aware"]
    head = out["headline"]
    assert (head["value"], head["baseline"], head["ratio"]) == (1.0, 2.0, 0.5)
    assert head["metric"].startswith("goodput 2m round_robin / goodput 2m cache_aware")

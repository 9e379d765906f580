"""``kvserve sim ratio``: the best split and band selection and the rate bisection, exactly;
a small sweep for the JSON's shape, its consistency and the PNG."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvserve.cli import main
from kvserve.sim.ratio import best_and_band, first_failing, parse_mix, splits


def test_best_and_band() -> None:
    goodputs = [("1p3d", 4.0), ("2p2d", 10.0), ("3p1d", 9.0), ("4m", 20.0)]
    assert best_and_band(goodputs[:3], 0.9) == ("2p2d", ["2p2d", "3p1d"])
    assert best_and_band(goodputs[:3], 0.95) == ("2p2d", ["2p2d"])
    assert best_and_band(goodputs[:3], 0.4) == ("2p2d", ["1p3d", "2p2d", "3p1d"])
    # whatever is passed competes, in the given order
    assert best_and_band(goodputs, 0.5) == ("4m", ["2p2d", "4m"])


def test_best_and_band_ties_and_nothing() -> None:
    assert best_and_band([("1p2d", 5.0), ("2p1d", 5.0)], 0.9) == ("1p2d", ["1p2d", "2p1d"])
    assert best_and_band([("1p2d", None), ("2p1d", 3.0)], 1.0) == ("2p1d", ["2p1d"])
    assert best_and_band([("1p2d", None), ("2p1d", 0.0)], 0.9) == (None, [])
    assert best_and_band([], 0.9) == (None, [])


@pytest.mark.parametrize("n", [0, 1, 2, 5, 8])
def test_first_failing_bisects(n: int) -> None:
    for fail_at in range(n + 1):
        calls: list[int] = []

        def passes(i: int, fail_at: int = fail_at, calls: list[int] = calls) -> bool:
            calls.append(i)
            return i < fail_at

        assert first_failing(passes, n) == fail_at
        assert len(calls) <= (n + 1).bit_length()
        assert len(set(calls)) == len(calls)


def test_splits_and_mixes() -> None:
    assert splits(3, True) == ["1p2d", "2p1d", "3m"]
    assert splits(4, False) == ["1p3d", "2p2d", "3p1d"]
    assert parse_mix("8192:32").label == "8192:32"
    with pytest.raises(Exception, match="INPUT:OUTPUT"):
        parse_mix("8192")


def test_small_sweep(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    argv = ["--instances", "3", "--mixes", "8192:8", "384:32", "--rates", "2", "16"]
    argv += ["--num-requests", "16", "--slo-ttft-s", "1", "--out", str(tmp_path)]
    assert main(["sim", "ratio", *argv]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert set(out) == {"bench", "conditions", "results", "headline"}
    assert out["bench"] == "sim ratio"
    assert out["conditions"]["splits"] == ["1p2d", "2p1d", "3m"]
    assert out["conditions"]["deployment"]["policy"] == "round_robin"
    rows = out["results"]
    assert [(r["mix"], r["workers"]) for r in rows] == [
        (mix, w) for mix in ("8192:8", "384:32") for w in ("1p2d", "2p1d", "3m")
    ]
    for r in rows:
        assert [p["rate"] for p in r["points"]] == sorted(p["rate"] for p in r["points"])
        assert {p["rate"] for p in r["points"]} <= {2.0, 16.0}
        assert all(0.0 <= p["attainment"] <= 1.0 for p in r["points"])
        assert r["colocated"] == (r["workers"] == "3m")
        assert r["prefill"] + r["decode"] == (0 if r["colocated"] else 3)
        assert 0.0 <= r["goodput_rps"] <= 16.0
        assert r["goodput_lower_bound"] == (r["first_failing_rate"] is None)
    head = out["headline"]
    for summary in head["by_mix"]:
        mine = [r for r in rows if r["mix"] == summary["mix"] and not r["colocated"]]
        top = max(r["goodput_rps"] for r in mine)
        if summary["best"] is not None:
            assert summary["best"] in summary["band"]
            assert summary["best_goodput_rps"] == top
            assert [r["workers"] for r in mine if r["best"]] == [summary["best"]]
        assert summary["band"] == [r["workers"] for r in mine if r["in_band"]]
        for rate, passing in summary["passing_by_rate"].items():
            for r in rows:
                if r["mix"] == summary["mix"] and any(
                    p["rate"] == float(rate) for p in r["points"]
                ):
                    point = next(p for p in r["points"] if p["rate"] == float(rate))
                    assert (r["workers"] in passing) == (point["attainment"] >= 0.9)
    first = head["by_mix"][0]
    assert head["value"] == first["best_goodput_rps"]
    assert head["baseline"] == first["colocated_goodput_rps"]
    # 16 prompts of 8192 tokens at 16 req/s overwhelm one prefill instance, but not one
    # with two decode workers that take prompts once it is backed up (prefill_locally)
    assert head["best_by_mix"] == {"8192:8": "1p2d", "384:32": "1p2d"}
    assert 2.0 < first["best_goodput_rps"] < 16.0
    assert (tmp_path / "ratio.png").stat().st_size > 0

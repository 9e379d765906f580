"""``kvserve sim crossover`` and ``kvserve sim hidden``: JSON shape, the properties that
follow from the formulas, and the PNGs."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from kvserve.cli import main
from kvserve.sim.costs import LinearCost
from kvserve.sim.crossover import crossover_gbps
from kvserve.sim.modelshape import load_shape

LINEAR = LinearCost(1e-3, 1e-5, 1e-9, 2e-4, 3e-7)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main(["sim", *argv]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert set(out) == {"bench", "conditions", "results", "headline"}
    return out


def cost_file(tmp_path: Path) -> str:
    path = tmp_path / "cost.json"
    shape = dataclasses.asdict(load_shape("smollm2-135m"))  # as kvserve sim calibrate writes
    path.write_text(json.dumps({**LINEAR.to_json(), "model_shape": shape, "dtype_bytes": 4}))
    return str(path)


def test_crossover_bisection() -> None:
    assert crossover_gbps(lambda b: 10 / b, 2.0, 0.01, 1e4)[0] == pytest.approx(5.0, rel=1e-8)
    assert crossover_gbps(lambda b: 10 / b, 2.0, 10.0, 1e4) == (None, "always_wins")
    assert crossover_gbps(lambda b: 10 / b, 2.0, 0.01, 4.0) == (None, "never_wins")


def test_crossover_roofline(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = run(capsys, "crossover", "--lengths", "512", "4096", "16384", "--out", str(tmp_path))
    assert out["bench"] == "sim crossover"
    assert out["conditions"]["cost"] == "roofline:h100:llama3-8b"
    rows = out["results"]
    assert [r["prompt_len"] for r in rows] == [512, 4096, 16384]
    for r in rows:
        assert r["colocated_ttft_s"] >= r["prefill_alone_s"] > 0
        assert r["kv_bytes"] == r["prompt_len"] * 131072
        assert r["streaming_verdict"] == r["no_streaming_verdict"] == "crossover"
        # streaming never exposes more than sending after the prefill, at any bandwidth
        assert r["crossover_gbps_streaming"] <= r["crossover_gbps_no_streaming"]
    assert out["headline"]["prompt_len"] == 16384
    assert out["headline"]["value"] == rows[-1]["crossover_gbps_streaming"]
    assert (tmp_path / "crossover.png").stat().st_size > 0


def test_crossover_without_streaming_is_kv_over_interference(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = ["--lengths", "1000", "5000", "--chunk-tokens", "1024", "--latency-us", "0"]
    argv += ["--decode-batch", "8", "--decode-context", "300"]
    out = run(capsys, "crossover", *argv, "--cost", cost_file(tmp_path), "--model",
              "smollm2-135m", "--hardware", "cpu")  # fmt: skip
    per_chunk = 8 * LINEAR.per_decode_seq_s + 8 * 300 * LINEAR.per_decode_context_s
    for r, chunks in zip(out["results"], (1, 5), strict=True):
        assert r["chunks"] == chunks
        assert r["interference_s"] == pytest.approx(chunks * per_chunk)
        assert r["kv_bytes"] == r["prompt_len"] * 2 * 30 * 3 * 64 * 4
        b_star = r["kv_bytes"] / r["interference_s"] / 1e9
        assert r["crossover_gbps_no_streaming"] == pytest.approx(b_star, rel=1e-8)


def test_crossover_without_interference_never_wins(capsys: pytest.CaptureFixture[str]) -> None:
    out = run(capsys, "crossover", "--lengths", "2048", "--decode-batch", "0")
    row = out["results"][0]
    assert row["interference_s"] == 0.0
    assert (row["crossover_gbps_streaming"], row["streaming_verdict"]) == (None, "never_wins")
    assert out["headline"]["value"] is None and out["headline"]["ratio"] is None


def test_hidden_roofline(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    argv = ["--layers", "8", "80", "--gbps", "1", "200", "--latency-us", "0"]
    out = run(capsys, "hidden", *argv, "--out", str(tmp_path))
    assert out["bench"] == "sim hidden"
    rows = out["results"]
    # the model's own 32 layers and the headline's 12.5 GB/s join the sweep
    assert sorted({(r["layers"], r["gbps"]) for r in rows}) == [
        (n, b) for n in (8, 32, 80) for b in (1, 12.5, 200)
    ]
    for n in (8, 32, 80):
        mine = sorted((r for r in rows if r["layers"] == n), key=lambda r: r["gbps"])
        shares = [r["hidden_share"] for r in mine]
        assert all(0 <= s <= 1 - 1 / n + 1e-12 for s in shares)
        # at zero latency, faster links hide no less (up to rounding)
        assert all(b >= a - 1e-12 for a, b in itertools.pairwise(shares))
        assert not mine[-1]["link_bound"]
        assert shares[-1] == pytest.approx(1 - 1 / n)
        for r in mine:
            assert r["exposed_s"] == pytest.approx((1 - r["hidden_share"]) * r["transfer_s"])
    headline = out["headline"]
    assert headline["target"] == pytest.approx(1 - 1 / 32)
    assert headline["value"] == next(
        r["hidden_share"] for r in rows if (r["layers"], r["gbps"]) == (32, 12.5)
    )
    assert (tmp_path / "hidden.png").stat().st_size > 0


def test_hidden_calibrated_cost_scales_prefill_with_layers(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = ["--layers", "15", "60", "--gbps", "3", "--headline-gbps", "3", "--prompt-len", "512"]
    out = run(capsys, "hidden", *argv, "--cost", cost_file(tmp_path), "--model", "smollm2-135m")
    by_layers = {r["layers"]: r for r in out["results"]}
    assert sorted(by_layers) == [15, 30, 60]
    base = by_layers[30]["prefill_s"]
    assert by_layers[15]["prefill_s"] == pytest.approx(base / 2)
    assert by_layers[60]["prefill_s"] == pytest.approx(base * 2)
    assert by_layers[60]["kv_bytes"] == 2 * by_layers[30]["kv_bytes"]

"""``kvserve sim calibrate | serve | shift`` end to end: real engine timing in, bench JSON out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvserve.cli import main

ROW_KEYS = {
    "rate",
    "offered_rate",
    "arrival",
    "summary",
    "by_input_len",
    "by_output_len",
    "server",
    "errors",
}


def run_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(argv) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


@pytest.fixture(scope="module")
def cost_file(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sim") / "tiny_cost.json"
    assert (
        main(
            [
                "sim",
                "calibrate",
                "--model",
                str(tiny_model_dir),
                "--output",
                str(path),
                "--repeat",
                "1",
                "--pin",
                "-1",
                "--kv-cache-mib",
                "64",
            ]
        )
        == 0
    )
    return path


def test_calibrate_writes_a_cost_fitted_on_the_engine_steps(cost_file: Path) -> None:
    data = json.loads(cost_file.read_text())
    assert data["kind"] == "linear" and data["model_shape"]["layers"] == 4
    assert data["fit"]["samples"] == len(data["samples"]) > 50
    assert any(c > 0 for c in data["coefficients"].values())


def test_sim_serve_with_the_calibrated_cost_gives_bench_serve_rows(
    cost_file: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = run_json(
        [
            "sim",
            "serve",
            "--cost",
            str(cost_file),
            "--workers",
            "1p1d",
            "--workload",
            "prefill-heavy",
            "--num-requests",
            "12",
            "--rates",
            "2",
            "8",
            "--slo-ttft-s",
            "1",
            "--slo-tpot-s",
            "0.1",
            "--kv-cache-mib",
            "64",
            "--no-progress",
            "--out",
            str(tmp_path),
        ],
        capsys,
    )
    assert out["bench"] == "sim serve"
    rows = out["results"][:2]
    assert [set(r) for r in rows] == [ROW_KEYS, ROW_KEYS]
    assert [r["summary"]["completed"] for r in rows] == [12, 12]
    assert out["conditions"]["deployment"]["workers"] == "1p1d"
    assert (tmp_path / "serve.json").exists() and (tmp_path / "latency_cdf.png").exists()


def test_sim_shift_runs_the_controller_off_and_on(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = run_json(
        [
            "sim",
            "shift",
            "--cost",
            "roofline:h100:llama3-8b",
            "--workers",
            "1p2d",
            "--kv-cache-mib",
            "0",
            "--phases",
            "2048:8@20x6",
            "64:64@20x6",
            "--controller-ttft-slo-s",
            "0.001",
            "--controller-interval-s",
            "1",
            "--controller-patience",
            "1",
            "--controller-min-samples",
            "2",
            "--out",
            str(tmp_path),
        ],
        capsys,
    )
    off, on = out["results"]
    assert (off["controller"], on["controller"]) == ("off", "on")
    assert off["moves"] == [] and on["moves"][0]["to_role"] == "prefill"
    assert off["requests"] == on["requests"] > 100 and off["failed"] == on["failed"] == 0
    assert (tmp_path / "shift_sim.png").exists()


def test_engine_step_log_feeds_calibrate(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from workers.config import EngineConfig
    from workers.core.sequence import SamplingParams
    from workers.engine.engine import Engine

    logs = tmp_path / "steps"
    engine = Engine(EngineConfig(model=str(tiny_model_dir), kv_cache_mib=16,
                                 step_log_dir=str(logs)))  # fmt: skip
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    for batch in ([[101] * 5], [[102] * 40], [[103] * 9, [104] * 70, [105] * 20]):
        engine.generate(batch, params)
    steps = engine.stats.steps
    engine.close()
    (log_file,) = logs.glob("steps-*.jsonl")
    lines = [json.loads(line) for line in log_file.read_text().splitlines()]
    assert len(lines) == steps and all(line["seconds"] > 0 for line in lines)
    # the last step decodes all three (6 tokens: the 6th sampled on prompt + 4 computed)
    assert lines[-1] == {**lines[-1], "prefill": [], "decode": [13, 74, 24]}
    out = tmp_path / "cost.json"
    assert main(["sim", "calibrate", "--from-step-logs", str(logs), "--output", str(out),
                 "--model", str(tiny_model_dir)]) == 0  # fmt: skip
    capsys.readouterr()
    data = json.loads(out.read_text())
    assert data["fit"]["samples"] == steps - 2 and data["conditions"]["source"] == "step logs"

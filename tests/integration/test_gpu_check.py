"""``python -m kvserve.gpucheck`` (what ``scripts/gpu_check.sh`` runs on a GPU machine) in its
CPU quick mode: every check runs for real (the engine against transformers, the pool round
trip across two processes through host staging and in place, ``kvserve bench engine`` as a
user runs it, the suite's one run of it; the vLLM backend's is skipped in quick mode, saying
where it runs: on the cluster of ``tests/integration/test_vllm_backend.py``) and the one JSON
file says each passed; a check that disagrees or breaks is recorded as such, alone."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvserve.gpucheck import roundtrip
from kvserve.gpucheck.exactness import CheckFailedError
from kvserve.gpucheck.run import OPTIONAL, _record

CHECKS = {"models", "tiny_exact", "smollm2_logits", "pool_staged", "pool_in_place", "bench_engine"}


def test_every_check_passes_on_the_cpu(tmp_path: Path, tiny_model_dir: Path) -> None:
    out = tmp_path / "gpu_check.json"
    argv = [sys.executable, "-m", "kvserve.gpucheck", "--device", "cpu", "--quick"]
    # about 42 s of CPU, several times that in wall time under the suite's load (225 s seen
    # with 300 allowed): the limit only stops a hang, within the run's own --budget-s (540)
    done = subprocess.run([*argv, "--out", str(out)], capture_output=True, text=True, timeout=720)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["passed"] and report["finished"] and report["conditions"]["device"] == "cpu"
    statuses = {name: check["status"] for name, check in report["checks"].items()}
    assert statuses == {**dict.fromkeys(CHECKS, "pass"), "vllm_backend": "skip"}, statuses
    checks = report["checks"]
    assert checks["pool_staged"]["staged"] and not checks["pool_in_place"]["staged"]
    assert checks["pool_staged"]["pages_equal"] == checks["pool_staged"]["pages"] > 0
    assert checks["tiny_exact"]["sequences_equal"] == checks["tiny_exact"]["sequences"]
    bench = checks["bench_engine"]["report"]  # `kvserve bench engine`'s stdout, one JSON object
    assert bench["bench"] == "engine" and bench["headline"]["target"] == 3.0
    assert [r["concurrency"] for r in bench["results"]] == [1, 2]
    assert {"model", "prompt_len", "output_len", "block_tokens", "commit"} <= set(
        bench["conditions"]
    )
    assert all(r["kvserve_decode_tok_s"] > 0 for r in bench["results"])
    assert "test_vllm_backend" in checks["vllm_backend"]["reason"]


def test_a_failed_or_broken_check_is_recorded_alone() -> None:
    def disagrees() -> dict[str, object]:
        raise CheckFailedError("differs", {"pages_equal": 3})

    def breaks() -> dict[str, object]:
        raise OSError("no device")

    failed, broken = _record(disagrees), _record(breaks)
    assert failed["status"] == "fail" and failed["pages_equal"] == 3
    assert broken["status"] == "error" and "no device" in broken["error"]
    assert _record(lambda: {"x": 1})["status"] == "pass"
    assert OPTIONAL == ("pool_in_place",)


def test_a_member_that_never_answers_is_given_up_and_ended(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(roundtrip, "MEMBER_TIMEOUT_S", 0.2)
    argv = [sys.executable, "-c", "import time; time.sleep(60)"]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    with pytest.raises(TimeoutError, match="writer"):
        roundtrip._answer(proc, "writer")
    roundtrip._finish(proc)
    assert proc.returncode is not None


def test_a_member_answers_a_failed_mode_with_its_error_and_stays_in_step(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("bogus\nbogus\ndone\nnever read\n"))
    assert roundtrip.main(["writer", "127.0.0.1:1", "http://127.0.0.1:1/metadata", "cpu"]) == 0
    answers = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(answers) == 2 and all("kv_staging" in a["error"] for a in answers), answers

"""The ``kvserve`` command as a user runs it (real subprocesses)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from workers.model.prepare import make_tiny_model

KVSERVE = [sys.executable, "-m", "kvserve"]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*KVSERVE, *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
    )


def test_generate_with_default_model_gives_real_text(default_model_dir: Path) -> None:
    proc = run("generate", "What is the capital of France?", "--max-tokens", "20")
    assert proc.returncode == 0, proc.stderr
    assert "Paris" in proc.stdout


def test_generate_settings_from_environment(tiny_model_dir: Path) -> None:
    proc = run(
        "generate",
        "--no-chat",
        "hello",
        "--max-tokens",
        "3",
        env={"KVSERVE_MODEL": str(tiny_model_dir), "KVSERVE_BLOCK_TOKENS": "8"},
    )
    assert proc.returncode == 0, proc.stderr
    assert "3 tokens" in proc.stderr


def test_missing_model_is_a_clear_error(tmp_path: Path) -> None:
    proc = run("generate", "hi", "--model", str(tmp_path / "nope"))
    assert proc.returncode == 2
    assert "no model at" in proc.stderr and "Traceback" not in proc.stderr


def test_make_model_is_deterministic(tmp_path: Path, default_model_dir: Path) -> None:
    a = make_tiny_model(tmp_path / "a", seed=3, tokenizer_dir=default_model_dir)
    proc = run(
        "make-model",
        "--out",
        str(tmp_path / "b"),
        "--seed",
        "3",
        "--tokenizer-from",
        str(default_model_dir),
    )
    assert proc.returncode == 0, proc.stderr
    digest = [
        hashlib.sha256((d / "model.safetensors").read_bytes()).hexdigest()
        for d in (a, tmp_path / "b")
    ]
    assert digest[0] == digest[1]
    other = make_tiny_model(tmp_path / "c", seed=4, tokenizer_dir=default_model_dir)
    assert (other / "model.safetensors").read_bytes() != (a / "model.safetensors").read_bytes()


def test_bench_engine_prints_one_json_object(tiny_model_dir: Path) -> None:
    proc = run(
        "bench",
        "engine",
        "--model",
        str(tiny_model_dir),
        "--concurrency",
        "1",
        "2",
        "--prompt-len",
        "8",
        "--output-len",
        "3",
        "--repeat",
        "1",
        "--serve-factor",
        "1",
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["bench"] == "engine"
    assert [r["concurrency"] for r in report["results"]] == [1, 2]
    assert {"model", "prompt_len", "output_len", "block_tokens", "commit"} <= set(
        report["conditions"]
    )
    assert report["headline"]["target"] == 3.0
    assert all(r["kvserve_decode_tok_s"] > 0 for r in report["results"])

"""Runs every check of :mod:`kvserve.gpucheck` and writes one JSON file of results.

Each check runs in a ``try``: its status is ``pass``, ``fail`` (the reference disagreed:
the figures say by how much) or ``error`` (it could not run: the error text), or ``skip``
(what it needs is missing: the reason). The exit status is 0 when no required check failed
or broke (``pool_in_place`` is information: GPUDirect may not be available).

The file is written again as each check starts (status ``running``) and ends, so a run cut
short (SIGTERM, ``timeout``) still leaves every result so far and names the check it was in
(``finished`` false).
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from kvserve.gpucheck.exactness import CheckFailedError, first_token_logits, greedy_exact
from kvserve.gpucheck.roundtrip import RoundTrips
from kvserve.gpucheck.vllm_path import vllm_missing, vllm_path
from kvserve.report import base_conditions

OPTIONAL = ("pool_in_place",)
QUICK_VLLM = (
    "quick mode: the vLLM backend's check runs on the CPU in the test suite "
    "(tests/integration/test_vllm_backend.py, on its shared cluster)"
)
"""Checks whose failure is reported but does not fail the run."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m kvserve.gpucheck", description=__doc__)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, default=Path("gpu_check.json"))
    parser.add_argument(
        "--quick", action="store_true", help="small sizes (a CPU run of every line)"
    )
    parser.add_argument(
        "--tokenizer-dir", type=Path, default=None,
        help="tokenizer (and config.json) for the tiny model where SmolLM2 is not installed",
    )  # fmt: skip
    parser.add_argument(
        "--budget-s", type=float, default=540.0,
        help="seconds for the whole run: bench engine gets what the other checks leave",
    )  # fmt: skip
    return parser


def _device_facts(device: str) -> dict[str, Any]:
    facts: dict[str, Any] = {"device": device, "cuda_available": torch.cuda.is_available()}
    if device.startswith("cuda") and torch.cuda.is_available():
        facts["gpu"] = torch.cuda.get_device_name(torch.device(device))
        facts["cuda"] = torch.version.cuda
    return facts


def _record(run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    t0 = time.perf_counter()
    try:
        result = {"status": "pass", **run()}
    except CheckFailedError as exc:
        result = {"status": "fail", "error": str(exc), **exc.figures}
    except Exception as exc:  # one broken check must not stop the others
        text = "".join(traceback.format_exception_only(exc)).strip()
        result = {"status": "error", "error": text, "trace": traceback.format_exc()[-2000:]}
    result["seconds"] = round(time.perf_counter() - t0, 2)
    return result


def _models(tokenizer_dir: Path | None) -> tuple[Path, Path | None, str]:
    """The tiny model, SmolLM2 (or None: the reason in the third value)."""
    from workers.model.prepare import prepare_default_model, tiny_model_dir

    try:
        smollm2: Path | None = prepare_default_model()
        why = ""
    except FileNotFoundError as exc:
        smollm2, why = None, str(exc)
    return tiny_model_dir(tokenizer_dir if smollm2 is None else None), smollm2, why


def _bench_engine(
    model: Path, device: str, dtype: str, quick: bool, timeout_s: float
) -> dict[str, Any]:
    sizes = ["1", "2"] if quick else ["1", "4", "16", "64"]
    argv = [sys.executable, "-m", "kvserve", "bench", "engine", "--model", str(model)]
    argv += ["--device", device, "--dtype", dtype, "--concurrency", *sizes]
    argv += ["--prompt-len", "16" if quick else "128", "--output-len", "8" if quick else "64"]
    argv += ["--repeat", "1" if quick else "3", "--kv-cache-mib", "64" if quick else "8192"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"bench engine failed ({done.returncode}): {done.stderr[-1500:]}")
    report: dict[str, Any] = json.loads(done.stdout)
    return {"model": model.name, "dtype": dtype, "report": report}


Save = Callable[[dict[str, dict[str, Any]]], None]


def checks(args: argparse.Namespace, save: Save) -> dict[str, dict[str, Any]]:
    """Every check's record, in order; ``save`` gets the records so far as each check starts
    and ends."""
    device, quick, deadline = args.device, args.quick, time.time() + args.budget_s
    out: dict[str, dict[str, Any]] = {}
    found: list[Any] = []

    def step(name: str, run: Callable[[], dict[str, Any]]) -> None:
        out[name] = {"status": "running"}
        save(out)
        out[name] = _record(run)
        save(out)

    def models() -> dict[str, Any]:
        found.extend(_models(args.tokenizer_dir))
        return {"tiny": str(found[0]), "smollm2": str(found[1]) if found[1] else None}

    step("models", models)
    if out["models"]["status"] != "pass":
        return out
    tiny, smollm2, why = found
    lengths = (5, 37) if quick else (5, 37, 100, 300)
    step("tiny_exact", lambda: greedy_exact(tiny, device, lengths, 8 if quick else 32))
    low = "bfloat16" if device.startswith("cuda") else "float32"
    if smollm2 is None:
        out["smollm2_logits"] = {"status": "skip", "reason": why}
    else:
        step("smollm2_logits", lambda: first_token_logits(smollm2, device, low, 64, 8))
    trips = RoundTrips(device)  # one master and one pair of members for both
    try:
        step("pool_staged", lambda: trips.run("always"))
        step("pool_in_place", lambda: trips.run("never"))
    finally:
        trips.close()
    if missing := vllm_missing() or (QUICK_VLLM if quick else ""):
        out["vllm_backend"] = {"status": "skip", "reason": missing}
    else:
        step("vllm_backend", lambda: vllm_path(tiny, device, low, 4 if quick else 16))
    model, dtype = (smollm2, low) if smollm2 is not None and not quick else (tiny, "float32")
    left = max(30.0, deadline - time.time())
    step("bench_engine", lambda: _bench_engine(model, device, dtype, quick, left))
    return out


def _passed(results: dict[str, dict[str, Any]]) -> bool:
    required = [r for name, r in results.items() if name not in OPTIONAL]
    return all(r["status"] in ("pass", "skip") for r in required)


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds: children are stopped, the file stays as saved


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _terminated)
    started = time.time()
    conditions = {**base_conditions(), **_device_facts(args.device), "quick": args.quick}

    def write(results: dict[str, dict[str, Any]], finished: bool = False) -> None:
        payload = {
            "check": "gpu", "conditions": conditions,
            "seconds": round(time.time() - started, 1), "finished": finished,
            "passed": finished and _passed(results), "checks": results,
        }  # fmt: skip
        partial = args.out.with_name(args.out.name + ".partial")  # never a torn file
        partial.write_text(json.dumps(payload, indent=2, default=str) + "\n")
        partial.replace(args.out)

    results = checks(args, write)
    write(results, finished=True)
    ok = _passed(results)
    summary = {name: r["status"] for name, r in results.items()}
    print(json.dumps({"passed": ok, "checks": summary, "out": str(args.out)}), flush=True)
    return 0 if ok else 1

"""The JSON of every ``kvserve bench`` verb, pinned: the key paths its output has when it
runs with the small settings of :data:`ARGV` (``tests/bench_schemas.json``).

A key path names a field: ``conditions.model``, ``results[].decode_ratio``; a list's
elements share their parent's path with ``[]``. Maps keyed by data (servers, models) pin
the names these settings give them.

The suite runs the verbs that need no cluster (``tests/integration/test_bench_schemas.py``);
the others start clusters or vLLM and take minutes, so they are checked by hand, before and
after a change to ``kvserve/bench/``::

    .venv/bin/python -m tests.bench_schemas [VERB ...]   # default: every verb of ARGV

runs each verb from the working tree as ``kvserve bench`` (outputs in a temporary folder),
prints whether its key paths match the pinned ones, and exits 1 when one does not. A change
that means to add or drop a field pins the verb's new key paths with ``--pin VERB ...``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

PINNED = Path(__file__).with_name("bench_schemas.json")

ARGV: dict[str, str] = {
    "engine": "--model {model} --concurrency 1 2 --prompt-len 8 --output-len 3 --repeat 1 "
    "--serve-factor 1",
    "profile": "--model {model} --concurrency 1 2 --prompt-len 8 --steps 2",
    "pool": "--sizes-kib 16 64 --batches 1 4 --repeat 1",
    "hashing": "--prompt-tokens 256 --repeat 1 --prefill-tokens 64",
    "edge": "--requests 200 --repeat 1",
    "index": "--held 2000 --prompt-blocks 256 --repeats 3",
    "overlap": "--model {model} --lengths 32 --modes after streaming push --repeat 1 "
    "--segment-mib 64 --kv-cache-mib 64",
    "prefix": "--model {model} --prefix 64 --tail 8 --repeat 1 --segment-mib 64 --kv-cache-mib 64",
    "ttft": "--model tiny --servers default,mixed1 --prompt-tokens 32 --requests 2 --warmup 1 "
    "--pause-s 0",
    "pressure": "--model {model} --requests 2 --phases 2 --prompt-len 64 --interval 0.5",
    "trace": "--max-requests 200 --out {out}/trace",
    "compare": "--model {model} --workload prefill-heavy --num-requests 6 --rates 2 "
    "--slo-ttft-s 5 --slo-tpot-s 1 --prefill-heavy-input 32 --prefill-heavy-output 4 "
    "--out {out}/compare",
    "shift": "--model {model} --phases 64:4@2x3 16:8@2x3 --window-s 2",
    "peer": "--model tiny --servers vllm,default --workloads random --rates inf "
    "--num-prompts 4 --log-dir {out}/peer",
}
"""Each verb's flags (``{model}``: the tiny model's folder, ``{out}``: a folder for files)."""


def key_paths(value: Any, prefix: str = "") -> set[str]:
    """Every key path of a JSON value (module docstring)."""
    paths: set[str] = set()
    if isinstance(value, dict):
        for key, inner in value.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            paths |= {path} | key_paths(inner, path)
    elif isinstance(value, list):
        for inner in value:
            paths |= key_paths(inner, prefix + "[]")
    return paths


def pinned(verb: str) -> set[str]:
    """The key paths pinned for ``verb``."""
    return set(json.loads(PINNED.read_text())[verb])


def argv(verb: str, model: Path, out: Path) -> list[str]:
    """``kvserve bench VERB ...`` with its small settings."""
    return ["bench", verb, *ARGV[verb].format(model=model, out=out).split()]


def mismatch(verb: str, payload: dict[str, Any]) -> str | None:
    """What differs between ``payload``'s key paths and the pinned ones (None: nothing)."""
    got, want = key_paths(payload), pinned(verb)
    if payload.get("bench") != verb:
        return f"bench is {payload.get('bench')!r}"
    if got == want:
        return None
    return f"missing {sorted(want - got)}, not pinned {sorted(got - want)}"


def main(verbs: list[str]) -> int:
    """Run ``verbs`` (default: all) from the working tree and check each, or with ``--pin``
    first, pin what they print (module docstring)."""
    from workers.model.prepare import tiny_model_dir

    pin = verbs[:1] == ["--pin"]
    verbs = verbs[1:] if pin else verbs
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for verb in verbs or list(ARGV):
            run = subprocess.run(
                [sys.executable, "-m", "kvserve", *argv(verb, tiny_model_dir(), Path(tmp))],
                capture_output=True,
                text=True,
            )
            try:
                payload = json.loads(run.stdout)
                if pin:
                    pins = json.loads(PINNED.read_text())
                    pins[verb] = sorted(key_paths(payload))
                    PINNED.write_text(json.dumps(pins, indent=1) + "\n")
                wrong = mismatch(verb, payload)
            except ValueError:
                wrong = f"no JSON (exit {run.returncode}): {run.stderr[-2000:]}"
            failed += wrong is not None
            print(f"{verb}: {wrong or 'key paths as pinned'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

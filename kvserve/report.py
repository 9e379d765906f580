"""The shared shape of every benchmark's output (DESIGN.md, "Shared conventions").

A benchmark prints exactly one JSON object on stdout::

    {"bench": name, "conditions": {...}, "results": [...], "headline": {...}}

Progress and logs go to stderr. ``conditions`` always carries the commit, threads and the
machine's CPU count, plus whatever the benchmark adds.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from typing import Any


def commit() -> str:
    """The current git commit (with ``+dirty`` if the tree has changes), or ``unknown``."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + ("+dirty" if dirty else "")


def base_conditions() -> dict[str, Any]:
    import torch  # here, so that importing a bench module (for its flags) stays cheap

    return {
        "commit": commit(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
    }


def median(values: list[float]) -> float:
    return float(statistics.median(values))


def emit(
    bench: str,
    conditions: dict[str, Any],
    results: list[dict[str, Any]],
    headline: dict[str, Any],
) -> None:
    """Print the one JSON object of a benchmark run on stdout."""
    payload = {
        "bench": bench,
        "conditions": {**base_conditions(), **conditions},
        "results": results,
        "headline": headline,
    }
    json.dump(payload, sys.stdout, indent=2)
    sys.stdout.write("\n")
    sys.stdout.flush()


def command(bench: str) -> str:
    """The words of the command whose JSON is named ``bench``: the simulator's (``sim
    serve``) as they are, a benchmark's with ``bench`` before them (``serve`` -> ``bench
    serve``)."""
    return bench if bench.startswith("sim ") else f"bench {bench}"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)

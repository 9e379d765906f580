"""``kvserve bench ttft``'s pure parts: reading the workers' step logs, and its servers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvserve.bench.ttft import ms, prefill_steps, run


def write_log(path: Path, steps: list[dict[str, object]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(s) + "\n" for s in steps))


def test_only_whole_prompt_prefills_of_the_length_count(tmp_path: Path) -> None:
    write_log(
        tmp_path / "prefill" / "steps-1.jsonl",
        [
            {"prefill": [[512, 0]], "decode": [], "seconds": 0.130},
            {"prefill": [[512, 0]], "decode": [], "seconds": 0.150},
            {"prefill": [[256, 0]], "decode": [], "seconds": 0.070},  # another length
            {"prefill": [[512, 0], [512, 0]], "decode": [], "seconds": 0.3},  # two at once
            {"prefill": [], "decode": [600], "seconds": 0.010},  # a decode step
        ],
    )
    write_log(
        tmp_path / "prefill" / "steps-2.jsonl",
        [{"prefill": [[512, 0]], "decode": [700], "seconds": 0.170}],
    )
    assert prefill_steps(tmp_path, "prefill", 512) == 150.0  # median of 130, 150, 170
    assert prefill_steps(tmp_path, "decode", 512) is None
    assert ms([0.1, 0.2, 0.4]) == 200.0


def test_only_kvserve_servers_are_measured() -> None:
    import argparse

    args = argparse.Namespace(model="tiny", servers="vllm,default", seed=0)
    with pytest.raises(SystemExit, match="vllm"):
        run(args)


def test_a_stream_without_a_chunk_has_no_time_to_report() -> None:
    """:func:`kvserve.bench.common.stream_ttft` raises rather than report a made-up time
    (its path through a real router: ``tests/integration/test_router_stub.py``)."""
    from types import SimpleNamespace
    from typing import Any

    from kvserve.bench.common import stream_ttft

    def create(**_: object) -> list[object]:
        return []

    empty: Any = SimpleNamespace(completions=SimpleNamespace(create=create))
    with pytest.raises(RuntimeError, match="3-token prompt ended without a chunk"):
        stream_ttft(empty, "m", [1, 2, 3], 2)

"""The JSON of the ``kvserve bench`` verbs that need no cluster keeps its pinned key paths
(:mod:`tests.bench_schemas`; the other verbs are checked by hand with ``python -m
tests.bench_schemas``). Each runs in this process at the pinned small settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvserve.cli import build_parser
from tests.bench_schemas import argv, key_paths, mismatch


@pytest.mark.parametrize("verb", ["engine", "profile"])
def test_a_bench_prints_its_pinned_fields(
    verb: str, tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = build_parser().parse_args(argv(verb, tiny_model_dir, tmp_path))
    assert args.func(args) == 0
    assert mismatch(verb, json.loads(capsys.readouterr().out)) is None


def test_a_field_more_or_less_is_a_mismatch() -> None:
    payload = {"bench": "edge", "conditions": {}, "results": [{"what": "x"}], "headline": {}}
    assert key_paths(payload) == {"bench", "conditions", "results", "results[].what", "headline"}
    assert mismatch("edge", payload) is not None
    assert mismatch("engine", payload) == "bench is 'edge'"

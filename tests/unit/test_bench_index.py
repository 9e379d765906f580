"""``bench index`` times the router's real prefix index, checks what it answered, and prints
its pinned JSON (figures not asserted)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from kvserve.bench import index_timing
from kvserve.cli import build_parser
from router.placement.prefix_index import PrefixIndex
from tests.bench_schemas import argv, mismatch


def small() -> argparse.Namespace:
    """The pinned small settings (``--held 2000 --prompt-blocks 256 --repeats 3``)."""
    return build_parser().parse_args(argv("index", Path(), Path()))


def test_bench_index_prints_its_rows_and_the_ratio_to_a_walk_per_worker(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = small()
    assert args.func(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert mismatch("index", out) is None
    assert out["conditions"]["workers"] == 4 and out["conditions"]["prompt_blocks"] == 256
    assert [r["what"] for r in out["results"]] == [
        "matched_all, wall",
        "matched_all, this thread's CPU",
        "matched_all, wall, fastest",
        "matched once per worker, wall (baseline)",
    ]
    us = [r["us"] for r in out["results"]]
    assert min(us) > 0
    headline = out["headline"]
    assert (headline["value"], headline["baseline"]) == (us[0], us[3])
    assert headline["ratio"] == pytest.approx(us[0] / us[3], abs=1e-3)


def test_each_worker_holds_its_share_of_the_chain_among_its_other_blocks() -> None:
    index, chain, truth = index_timing.filled(small())
    assert truth == {"w0": 64, "w1": 128, "w2": 192, "w3": 256}
    assert index.matched_all(chain) == truth
    assert len(set(chain)) == 256


def test_a_wrong_answer_ends_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(PrefixIndex, "matched_all", lambda self, hashes: {"w0": 1})
    with pytest.raises(RuntimeError, match="the index answered"):
        index_timing.time_questions(small())


@pytest.mark.parametrize("flags", [["--prompt-blocks", "0"], ["--held", "10"], ["--workers", "0"]])
def test_settings_that_cannot_be_built_are_refused(flags: list[str]) -> None:
    args = build_parser().parse_args([*argv("index", Path(), Path()), *flags])
    with pytest.raises(SystemExit, match="bench index"):
        index_timing.filled(args)

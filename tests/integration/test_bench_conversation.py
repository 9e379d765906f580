"""The conversation workload of ``kvserve bench serve`` against two mixed workers on the tiny
model (router policy cache_aware): every turn is sent after the previous answer, carries the
whole conversation so far, and finds the earlier turns' KV cached; the rows summarise it
per turn. No timing assertions: only the order of events and the counts."""

from __future__ import annotations

import argparse
import itertools
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvserve.bench import serve
from kvserve.cluster.launch import Cluster
from kvserve.loadgen.metrics import RequestRecord
from tests.tiny_cluster import tiny_cluster_spec

CONVERSATIONS, TURNS = 3, 3


@pytest.fixture(scope="module")
def cluster(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    spec = tiny_cluster_spec(
        tiny_model_dir, tmp_path_factory.mktemp("cluster"), prefill=0, decode=0, mixed=2,
        policy="cache_aware",
    )  # fmt: skip
    with Cluster(spec).start() as running:
        yield running


def test_conversations_grow_turn_by_turn_and_reuse_their_cache(
    cluster: Cluster, tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "--url", cluster.router_url, "--tokenizer", str(tiny_model_dir),
        "--workload", "conversation",
        "--conversations", str(CONVERSATIONS), "--turns", str(TURNS),
        "--first-prompt-len", "48", "--user-message-len", "4", "--answer-len", "16",
        "--think-s", "0.2", "--rates", "inf", "--warmup", "0", "--no-progress",
        "--out", str(tmp_path),
    ]  # fmt: skip
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    assert serve.run(parser.parse_args(argv)) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["conditions"]["prompt_format"] == "text"
    assert report["conditions"]["num_requests"] == CONVERSATIONS * TURNS
    lines = (tmp_path / "records_0.jsonl").read_text().splitlines()
    records = [RequestRecord(**{**json.loads(x), "chunk_times_s": ()}) for x in lines]
    assert [r.error for r in records] == [None] * CONVERSATIONS * TURNS
    pairs = [(r.conversation, r.turn) for r in records]
    assert pairs == [(c, t) for c in range(CONVERSATIONS) for t in range(TURNS)]
    for c in range(CONVERSATIONS):
        turns = records[c * TURNS : (c + 1) * TURNS]
        for before, after in itertools.pairwise(turns):
            assert after.start_s >= after.arrival_s > before.end_s  # the answer, then think
            assert after.prompt_tokens and before.prompt_tokens
            assert after.prompt_tokens > before.prompt_tokens + before.output_tokens
    assert sum(r.cached_tokens or 0 for r in records if r.turn > 0) > 0

    (row,) = report["results"]  # no SLO: no sweep row
    block = row["conversation"]
    assert list(block["by_turn"]) == [str(t) for t in range(TURNS)]
    assert all(s["completed"] == CONVERSATIONS for s in block["by_turn"].values())
    assert block["overall"]["completed"] == CONVERSATIONS * TURNS
    assert block["by_turn"]["1"]["cache_hit_rate"] > 0
    sources = block["prompt_sources"]
    assert sources is not None and sum(sources.values()) == pytest.approx(1.0)

"""``kvserve bench serve`` against the real system: Redis, mooncake_master, router, one
prefill and one decode worker on the tiny model; a small shared-prefix workload at two
rates. Checks the JSON's structure and that its numbers agree with each other (no timing
assertions)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvserve.bench import serve
from kvserve.cluster.launch import Cluster
from tests.tiny_cluster import tiny_cluster_spec

REQUESTS = 12


@pytest.fixture(scope="module")
def cluster(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    spec = tiny_cluster_spec(
        tiny_model_dir, tmp_path_factory.mktemp("cluster"), disagg_threshold_tokens=None
    )
    with Cluster(spec).start() as running:
        yield running


def verb_wired() -> bool:
    from kvserve.cli import build_parser

    try:
        build_parser().parse_args(["bench", "serve", "--url", "http://127.0.0.1:1"])
    except SystemExit:
        return False
    return True


def bench_serve(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """The JSON of ``kvserve bench serve ARGV``: a subprocess once the verb is wired, else
    :func:`serve.run` in-process through a parser built from its arguments."""
    if verb_wired():
        cmd = [sys.executable, "-m", "kvserve", "bench", "serve", *argv]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)
        out: dict[str, Any] = json.loads(done.stdout)
        return out
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    assert serve.run(parser.parse_args(argv)) == 0
    return dict(json.loads(capsys.readouterr().out))


def test_shared_prefix_at_two_rates(
    cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "--url", cluster.router_url, "--workload", "shared-prefix",
        "--num-requests", str(REQUESTS), "--prefix-groups", "2", "--prefix-len", "64",
        "--suffix-len", "8", "--prefix-output-len", "4", "--rates", "4", "inf",
        "--concurrency", "4", "--warmup", "1", "--slo-ttft-s", "60", "--slo-tpot-s", "10",
        "--deployment", "roles=1P1D", "--out", str(tmp_path), "--no-progress",
    ]  # fmt: skip
    report = bench_serve(argv, capsys)
    assert report["bench"] == "serve"
    assert set(report) == {"bench", "conditions", "results", "headline"}
    conditions = report["conditions"]
    assert conditions["rates"] == [4.0, "inf"]
    assert conditions["deployment"] == {"roles": "1P1D"}
    assert conditions["workload_params"]["groups"] == 2
    assert {"commit", "seed", "model", "slo", "concurrency"} <= set(conditions)
    *rows, sweep = report["results"]
    assert [r["rate"] for r in rows] == [4.0, "inf"]
    for row in rows:
        s = row["summary"]
        assert s["requests"] == s["completed"] == REQUESTS, row["errors"]
        assert s["failed"] == s["rejected"] == 0
        assert 0.0 <= s["slo_attainment"] <= 1.0
        assert s["cache_hit_rate"] > 0
        assert s["ttft_s"]["count"] == REQUESTS
        assert s["ttft_s"]["p50"] <= s["ttft_s"]["p99"] <= s["e2e_s"]["p99"] + 1e-9
        assert s["output_throughput"] > 0
        assert sum(b["requests"] for b in row["by_input_len"].values()) == REQUESTS
        assert sum(b["requests"] for b in row["by_output_len"].values()) == REQUESTS
        server = row["server"]
        assert server is not None and server["prompt_tokens"]
    assert len(sweep["attainment_by_rate"]) == 2
    assert report["headline"]["metric"].startswith("goodput")
    assert {p.name for p in tmp_path.iterdir()} >= {"serve.json", "latency_cdf.png"}

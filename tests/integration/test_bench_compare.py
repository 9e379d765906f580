"""``kvserve bench compare`` end to end on the tiny model: it starts each deployment itself,
runs the same workload on it, stops it, and reports both attainment curves and the ratio."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvserve.cluster.deployment import parse_deployment


def test_deployment_names() -> None:
    assert parse_deployment("1p1d") == (1, 1, 0)
    assert parse_deployment("2m") == (0, 0, 2)
    assert parse_deployment("2p1d1m") == (2, 1, 1)
    for bad in ("", "p1d", "1x", "1d1p"):
        with pytest.raises(ValueError):
            parse_deployment(bad)


def test_compare_runs_both_deployments_on_the_same_cores(tiny_model_dir: Path) -> None:
    cmd = [sys.executable, "-m", "kvserve", "bench", "compare", "--model", str(tiny_model_dir),
           "--deployments", "1p1d", "2m", "--workload", "prefill-heavy",
           "--prefill-heavy-input", "64", "--num-requests", "4", "--rates", "4",
           "--slo-ttft-s", "30", "--slo-tpot-s", "5", "--kv-cache-mib", "16",
           "--block-tokens", "16", "--threads", "1", "--segment-mib", "32", "--warmup", "0",
           "--no-progress", "--disagg-threshold-tokens", "0"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["bench"] == "compare"
    assert [r["deployment"] for r in out["results"]] == ["1p1d", "2m"]
    for row in out["results"]:
        (run,) = row["runs"]
        assert run["summary"]["completed"] == 4
        assert row["attainment_by_rate"][0][1] == 1.0  # generous SLOs: every request meets
        if (os.cpu_count() or 1) >= 2:
            cores = list(row["placement"]["workers"].values())
            assert len({c for worker in cores for c in worker}) == sum(map(len, cores))
    head = out["headline"]
    assert head["ratio"] == pytest.approx(head["value"] / head["baseline"])
    disagg = out["results"][0]["runs"][0]["server"]
    assert disagg is not None

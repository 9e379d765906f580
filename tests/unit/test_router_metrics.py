"""The router's /metrics: vLLM's names and labels for the request figures, each prompt
token counted once by source, and every exported name in the README's table."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from proto import worker_pb2 as pb
from router.flow.types import FlowResult
from router.observability.cache_stats import CacheStats
from router.observability.metrics import RouterMetrics
from router.observability.telemetry import Telemetry
from workers.core.histogram import Buckets
from workers.serve.metrics_http import WorkerCollector, WorkerSample

README = Path(__file__).resolve().parents[2] / "README.md"


def values(metrics: RouterMetrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = metrics.render().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def test_a_disaggregated_request_in_vllm_names() -> None:
    metrics = RouterMetrics()
    metrics.set_model("tiny")
    telemetry = Telemetry(metrics, CacheStats())
    usage = pb.PromptUsage(prompt_tokens=100, local_tokens=32, pool_tokens=48, computed_tokens=20)
    telemetry.on_prefill("p-0", usage, None)
    telemetry.on_first_token("disagg", "p-0", 0.2)
    telemetry.on_chunk("disagg", "d-0", 0.03, 3)
    telemetry.on_finish(FlowResult("disagg", "d-0", "ok", 1.0, 0.2, 4, 0, 100, "length"))
    telemetry.on_finish(FlowResult("local", "d-0", "cancelled", 0.5, None, 0, 0, 7, None))
    got = values(metrics)

    def at(name: str, **labels: str) -> float:
        return got[(name, frozenset({"model_name": "tiny", **labels}.items()))]

    p0, d0 = {"worker": "p-0"}, {"worker": "d-0"}
    assert at("vllm:prompt_tokens_total", **p0) == 100
    assert at("vllm:prefix_cache_queries_total", **p0) == 100
    assert at("vllm:prefix_cache_hits_total", **p0) == 32
    assert at("vllm:external_prefix_cache_queries_total", **p0) == 68
    assert at("vllm:external_prefix_cache_hits_total", **p0) == 48
    by_source = {s: at("vllm:prompt_tokens_by_source_total", **p0, source=s) for s in (
        "local_cache_hit", "external_kv_transfer", "local_compute")}  # fmt: skip
    assert by_source == {"local_cache_hit": 32, "external_kv_transfer": 48, "local_compute": 20}
    assert at("vllm:generation_tokens_total", **d0) == 4
    assert at("vllm:time_to_first_token_seconds_count", mode="disagg", **p0) == 1
    assert at("vllm:inter_token_latency_seconds_sum", mode="disagg", **d0) == pytest.approx(0.01)
    assert at("vllm:e2e_request_latency_seconds_count", mode="disagg", **d0) == 1
    assert at("vllm:request_success_total", finished_reason="length") == 1
    assert at("vllm:request_success_total", finished_reason="abort") == 1
    assert at("vllm:request_prompt_tokens_sum") == 107
    assert at("vllm:request_generation_tokens_count") == 2
    assert got[("kvserve:requests_total", frozenset({"status": "cancelled"}.items()))] == 1


def exported_names() -> set[str]:
    """Every family either side exports (the router's after some traffic; a worker's)."""
    metrics = RouterMetrics()
    telemetry = Telemetry(metrics, CacheStats())
    telemetry.on_transfer("write", pb.Transfer(bytes=1, seconds=0.1))
    telemetry.on_migrate("d-0", "d-1")
    telemetry.on_finish(FlowResult("local", "d-0", "ok", 1.0, 0.2, 4, 0, 9, "stop"))
    names = {f.name for f in text_string_to_metric_families(metrics.render().decode())}
    sample = WorkerSample(pb.LoadReport(), 0, Buckets())
    collector = WorkerCollector("d-0", "tiny", lambda: sample, str)
    names |= {f.name for f in collector.collect()}
    return {n for n in names if not n.endswith("_created")}  # prometheus_client's, per counter


def test_every_name_is_in_the_readme_table() -> None:
    table = set(re.findall(r"`((?:vllm|kvserve):[a-z0-9_]+)`", README.read_text()))
    missing = sorted(n for n in exported_names() if not {n, f"{n}_total"} & table)
    assert not missing, f"README's metrics table lacks {missing}"
    assert exported_names() >= {"vllm:time_to_first_token_seconds", "vllm:num_requests_running"}

"""The whole system, as a user runs it: real Redis, mooncake_master, router and workers
(2 prefill + 1 decode on the tiny model), talked to with the official ``openai`` client.

- greedy outputs, streaming and not, equal the colocated in-process engine's and
  transformers' for prompts with and without a partial last block;
- a request sharing a long prefix with an earlier one, prefilled on the other prefill
  worker, takes the prefix from the pool (usage, /v1/cache/stats and /metrics say so) and
  computes only the rest;
- a stream cancelled mid-way gives every page back on every worker.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import openai
import pytest

from kvpool.config import PoolConfig
from kvserve.cluster import Cluster, ClusterSpec
from proto import worker_pb2 as pb
from proto import worker_pb2_grpc
from tests.integration.reference import hf_greedy
from workers.config import EngineConfig
from workers.engine import Engine
from workers.sequence import SamplingParams

BLOCK = 16
MODEL_NAME = "tiny-llama"


@pytest.fixture(scope="module")
def cluster(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    spec = ClusterSpec(
        prefill=2,
        decode=1,
        engine=EngineConfig(
            model=str(tiny_model_dir), block_tokens=BLOCK, kv_cache_mib=16, threads=1
        ),
        pool=PoolConfig(pool_segment_mib=64, pool_local_buffer_mib=16),
        policy="round_robin",
        disagg_threshold_tokens=0,
        pin_cores=False,
        threads_per_worker=1,
        log_dir=tmp_path_factory.mktemp("cluster"),
        startup_timeout_s=180,
    ).with_free_ports()
    with Cluster(spec).start() as running:
        yield running


@pytest.fixture(scope="module")
def client(cluster: Cluster) -> openai.OpenAI:
    return openai.OpenAI(base_url=cluster.router_url + "/v1", api_key="unused", max_retries=0)


def prompt_of(length: int, seed: int) -> list[int]:
    return [(seed * 7919 + i * 104729) % 49000 + 100 for i in range(length)]


def completion_text(client: openai.OpenAI, prompt: list[int], n: int, stream: bool) -> str:
    if not stream:
        out = client.completions.create(
            model=MODEL_NAME, prompt=prompt, max_tokens=n, temperature=0
        )
        return out.choices[0].text
    chunks = client.completions.create(
        model=MODEL_NAME, prompt=prompt, max_tokens=n, temperature=0, stream=True
    )
    return "".join(c.choices[0].text for c in chunks if c.choices)


def test_greedy_outputs_match_colocated_engine_and_transformers(
    client: openai.OpenAI, tiny_model_dir: Path
) -> None:
    prompts = [prompt_of(n, seed) for seed, n in enumerate((5, 16, 40, 71))]
    n = 12
    engine = Engine(EngineConfig(model=str(tiny_model_dir), block_tokens=BLOCK, num_kv_blocks=64))
    colocated = engine.generate(prompts, SamplingParams(max_tokens=n, temperature=0))
    for prompt, local in zip(prompts, colocated, strict=True):
        reference = hf_greedy(tiny_model_dir, prompt, n)[: len(local.output_token_ids)]
        assert local.output_token_ids == reference
        expected = engine.tokenizer.decode(reference)
        assert completion_text(client, prompt, n, stream=False) == expected
        assert completion_text(client, prompt, n, stream=True) == expected


def cache_stats(cluster: Cluster) -> dict[str, Any]:
    import json
    import urllib.request

    with urllib.request.urlopen(cluster.router_url + "/v1/cache/stats", timeout=10) as r:
        stats: dict[str, Any] = json.load(r)
    workers: dict[str, Any] = stats["since_start"]["workers"]
    return workers


def metric(cluster: Cluster, name: str, **labels: str) -> float:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(cluster.router_url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def test_shared_prefix_from_the_pool_on_the_other_prefill_worker(
    client: openai.OpenAI, cluster: Cluster
) -> None:
    prefix = prompt_of(160, 42)
    first = client.completions.create(
        model=MODEL_NAME, prompt=[*prefix, 11, 12, 13], max_tokens=2, temperature=0
    )
    before = cache_stats(cluster)
    pool_before = metric(cluster, "kvserve_prompt_tokens_total", source="pool")
    second = client.completions.create(
        model=MODEL_NAME, prompt=[*prefix, 21, 22, 23, 24], max_tokens=2, temperature=0
    )
    after = cache_stats(cluster)
    assert first.usage is not None and second.usage is not None
    details = second.usage.prompt_tokens_details
    assert details is not None and details.cached_tokens == len(prefix)  # 10 full blocks
    served = [w for w in after if w.startswith("prefill") and after[w] != before.get(w)]
    assert len(served) == 1, after
    worker = after[served[0]]
    was = before.get(served[0], {"pool_tokens": 0, "computed_tokens": 0, "local_tokens": 0})
    assert worker["pool_tokens"] - was["pool_tokens"] == len(prefix)
    assert worker["local_tokens"] == was["local_tokens"]
    assert worker["computed_tokens"] - was["computed_tokens"] == 4
    assert metric(cluster, "kvserve_prompt_tokens_total", source="pool") - pool_before == len(
        prefix
    )


def loads(cluster: Cluster) -> dict[str, pb.LoadReport]:
    out = {}
    for role, addresses in cluster.worker_addresses.items():
        for i, address in enumerate(addresses):
            with grpc.insecure_channel(address) as channel:
                stub = worker_pb2_grpc.WorkerStub(channel)
                out[f"{role}-{i}"] = stub.GetLoad(pb.LoadRequest(), timeout=10)
    return out


def test_cancelled_stream_returns_every_page(client: openai.OpenAI, cluster: Cluster) -> None:
    stream = client.completions.create(
        model=MODEL_NAME, prompt=prompt_of(50, 7), max_tokens=1900, temperature=0, stream=True
    )
    received = 0
    for chunk in stream:
        received += bool(chunk.choices and chunk.choices[0].text)
        if received >= 3:
            break
    stream.close()
    deadline = time.monotonic() + 60
    while True:
        reports = loads(cluster)
        idle = all(
            r.running == 0 and r.waiting == 0 and r.reserved == 0 and r.free_pages == r.total_pages
            for r in reports.values()
        )
        if idle or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert idle, {name: str(r) for name, r in reports.items()}
    decode = reports["decode-0"]
    assert decode.output_tokens < 1900  # it stopped early: the abort reached it


def test_cache_salts_keep_tenants_apart(client: openai.OpenAI, tiny_model_dir: Path) -> None:
    """The same long prompt under two salts shares nothing, in any worker's cache or in
    the pool; under one salt it is reused; the output is the same either way."""
    prompt = prompt_of(96, 77)

    def run(salt: str) -> tuple[str, int]:
        out = client.completions.create(
            model=MODEL_NAME, prompt=prompt, max_tokens=4, temperature=0,
            extra_body={"cache_salt": salt},
        )  # fmt: skip
        details = out.usage.prompt_tokens_details if out.usage else None
        return out.choices[0].text, (details.cached_tokens or 0) if details else 0

    first, cached_first = run("tenant-a")
    again, cached_again = run("tenant-a")
    other, cached_other = run("tenant-b")
    assert cached_first == 0 and cached_again == (len(prompt) - 1) // BLOCK * BLOCK
    assert cached_other == 0
    assert first == again == other

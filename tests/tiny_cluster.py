"""The one-machine cluster the integration and end-to-end tests run: the tiny model, a
16 MiB KV cache and 16-token blocks per worker, a 64 MiB pool segment, one thread per
worker, no core pinning and free ports, so that several such clusters fit on a 2-core
machine one after the other."""

from __future__ import annotations

import dataclasses
import json
import urllib.request
from pathlib import Path
from typing import Any

import openai

from kvpool.config import PoolConfig
from kvserve.cluster.launch import Cluster, ClusterSpec
from router.api.status import StatusReport
from tests.staging import STAGING
from workers.config import EngineConfig, VllmOptions

BLOCK = 16
MODEL_NAME = "tiny-llama"
FAST_FAULT_ROUTER = ("--peer-timeout-s", "2")
"""Router flags of a cluster whose tests freeze or cut off workers: a frozen peer fails its
calls within about 2 s."""
FAST_FAULT_WORKER = (*FAST_FAULT_ROUTER, "--pool-transfer-timeout-s", "2")
"""Worker flags of such a cluster: the same, and a read of blocks held in a frozen worker's
pool segment misses within 2 s (Mooncake's transport spins a core while it waits)."""


def tiny_cluster_spec(
    model_dir: Path, log_dir: Path, *, engine: dict[str, Any] | None = None, **spec: Any
) -> ClusterSpec:
    """A :class:`ClusterSpec` for the tiny model; ``engine`` overrides
    :class:`EngineConfig` fields, ``spec`` overrides :class:`ClusterSpec` fields (by
    default 1 prefill + 1 decode worker, every request disaggregated). The router reads
    the tokenizer from ``model_dir`` (``--tokenizer-dir``, before any ``router_args``)."""
    base = EngineConfig(model=str(model_dir), block_tokens=BLOCK, kv_cache_mib=16, threads=1)
    defaults: dict[str, Any] = {
        "prefill": 1,
        "decode": 1,
        "pool": PoolConfig(pool_segment_mib=64, pool_local_buffer_mib=16, kv_staging=STAGING),
        "disagg_threshold_tokens": 0,
        "pin_cores": False,
        "threads_per_worker": 1,
        "startup_timeout_s": 180,
    }
    router_args = ("--tokenizer-dir", str(model_dir), *spec.pop("router_args", ()))
    return ClusterSpec(
        engine=dataclasses.replace(base, **(engine or {})),
        log_dir=log_dir,
        router_args=router_args,
        **{**defaults, **spec},
    ).with_free_ports()


def prompt_of(length: int, seed: int) -> list[int]:
    """``length`` token ids, a fixed function of ``seed`` (distinct seeds share no prefix)."""
    return [(seed * 7919 + i * 104729) % 49000 + 100 for i in range(length)]


def cluster_client(cluster: Cluster, timeout: float = 120) -> openai.OpenAI:
    """The official OpenAI client on ``cluster``'s router (its balancer, with several),
    without retries (a test sees every error)."""
    return client_at(cluster.router_url, timeout)


def client_at(url: str, timeout: float = 120) -> openai.OpenAI:
    """The official OpenAI client on the router at ``url`` (e.g. one of several:
    ``cluster.routers.urls[name]``), without retries."""
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=timeout)


def router_status(cluster: Cluster) -> StatusReport:
    """``GET /v1/status`` of ``cluster``'s router (no API key), parsed."""
    with urllib.request.urlopen(cluster.router_url + "/v1/status", timeout=10) as answer:
        return StatusReport.model_validate(json.load(answer))


VLLM_BLOCK = 32
"""Tokens per block of the clusters with vLLM workers: vLLM's CPU kernels take multiples of
32 only, and one block size serves the whole cluster."""


def vllm_cluster_spec(model_dir: Path, log_dir: Path, **spec: Any) -> ClusterSpec:
    """:func:`tiny_cluster_spec` with vLLM-backed workers (``--engine vllm``, eager: no
    compile), 32-token blocks and a 64 MiB KV cache each."""
    engine = {"block_tokens": VLLM_BLOCK, "kv_cache_mib": 64, **spec.pop("engine", {})}
    defaults: dict[str, Any] = {
        "worker_engine": "vllm",
        "vllm": VllmOptions(vllm_compile=False),
        "startup_timeout_s": 300,
    }
    return tiny_cluster_spec(model_dir, log_dir, engine=engine, **{**defaults, **spec})

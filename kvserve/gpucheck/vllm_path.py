"""The vLLM backend on the device (see :mod:`kvserve.gpucheck`): a loopback cluster of one
vLLM prefill worker and one vLLM decode worker (``--engine vllm``) on the tiny model, every
request disaggregated, so each prompt goes prefill worker -> pool -> decode worker through
the kvserve connector and vLLM's device caches.

It passes when the connector accepted vLLM's cache (the layout it found reads back exactly
what vLLM's own cache-update op wrote: else the workers refuse to start), every prompt is
answered, the decode worker took every prompt token from the pool (none recomputed) and no
block failed its digest or MAC. Skipped, saying why, on a machine without vLLM's
environment (``KVSERVE_VLLM=1 scripts/setup.sh``; a GPU machine with no network cannot
install it).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import openai

from kvpool.config import PoolConfig
from kvserve.cluster import faults
from kvserve.cluster.launch import Cluster, ClusterSpec
from kvserve.gpucheck.exactness import CheckFailedError
from kvserve.vllm_env import installed
from workers.config import EngineConfig, VllmOptions

BLOCK = 32
LENGTHS = (5, 33, 100)


def vllm_missing() -> str:
    """Why the check cannot run here ('' when it can)."""
    try:
        installed()
    except RuntimeError as exc:
        return str(exc)
    return ""


def vllm_path(model: Path, device: str, dtype: str, new_tokens: int) -> dict[str, Any]:
    """Run the check (module docstring); its figures, or CheckFailedError."""
    engine = EngineConfig(
        model=str(model), device=device, dtype=dtype, block_tokens=BLOCK, kv_cache_mib=256
    )
    with tempfile.TemporaryDirectory(prefix="gpucheck-vllm-") as logs:
        spec = ClusterSpec(
            engine=engine, worker_engine="vllm", vllm=VllmOptions(vllm_compile=False),
            pool=PoolConfig(pool_segment_mib=128), disagg_threshold_tokens=0,
            pin_cores=False, threads_per_worker=1, log_dir=Path(logs), startup_timeout_s=420,
        ).with_free_ports()  # fmt: skip
        with Cluster(spec).start() as cluster:
            return check_cluster(cluster, model.name, "decode-0", new_tokens)


def check_cluster(cluster: Cluster, model: str, decoder: str, new_tokens: int) -> dict[str, Any]:
    """Send :data:`LENGTHS` prompts through ``cluster``'s router (every one disaggregated)
    and check them on its only decode worker ``decoder`` (module docstring)."""
    before = faults.load_of(cluster, decoder)
    client = openai.OpenAI(base_url=cluster.router_url + "/v1", api_key="x", max_retries=0)
    answered = 0
    for i, length in enumerate(LENGTHS):
        prompt = [100 + (i * 31 + j * 7 + new_tokens) % 5000 for j in range(length)]
        out = client.completions.create(
            model=model, prompt=prompt, max_tokens=new_tokens, temperature=0
        )
        answered += bool(out.choices and out.usage and out.usage.completion_tokens)
    after = faults.load_of(cluster, decoder)
    figures = {
        "prompts": len(LENGTHS),
        "answered": answered,
        "decode_pool_tokens": after.prompt_tokens_pool - before.prompt_tokens_pool,
        "decode_computed_tokens": after.prompt_tokens_computed - before.prompt_tokens_computed,
        "checksum_failures": after.pool_checksum_failures - before.pool_checksum_failures,
        "forged_blocks": after.pool_forged_blocks - before.pool_forged_blocks,
    }
    if answered != len(LENGTHS):
        raise CheckFailedError("not every prompt was answered", figures)
    if figures["decode_pool_tokens"] != sum(LENGTHS) or figures["decode_computed_tokens"]:
        raise CheckFailedError("the decode worker recomputed prompt tokens", figures)
    if figures["checksum_failures"] or figures["forged_blocks"]:
        raise CheckFailedError("pool blocks failed verification", figures)
    return figures

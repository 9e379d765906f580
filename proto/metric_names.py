"""Prometheus naming shared by the router's and the workers' ``/metrics`` (README, "Metrics").

Contract: a figure vLLM also exports keeps vLLM's name (``vllm:`` prefix), meaning and
type, so dashboards built for vLLM (and llm-d) read kvserve; a figure of ours alone is
named under the same convention with the ``kvserve:`` prefix. vLLM's series carry
:data:`MODEL_LABEL` as vLLM's do (the model's name as the workers register it, the same
value on both sides, whatever ``--served-model-name`` says). Each series comes from
exactly one process: request figures from the router, a worker's state and its engine's
own counters from that worker.
"""

from __future__ import annotations

VLLM = "vllm:"
"""Prefix of a figure vLLM exports under the same name."""
OURS = "kvserve:"
"""Prefix of a figure of kvserve alone."""
MODEL_LABEL = "model_name"
"""vLLM's label for the served model."""
WORKER_LABEL = "worker"
"""The worker id (``prefill-0``, ...), on every per-worker series."""
ROLE_LABEL = "role"
"""A worker's role as it reports it now: a series follows the worker, not its job."""

PROMPT_SOURCES = {
    "local": "local_cache_hit",
    "pool": "external_kv_transfer",
    "computed": "local_compute",
}
"""Where a prompt token's KV came from: ours -> the ``source`` values of vLLM's
``vllm:prompt_tokens_by_source_total`` (the pool is vLLM's external KV connector)."""


def one_two_five(top: float, start: float = 1.0) -> tuple[float, ...]:
    """Bucket bounds 1, 2, 5, 10, 20, 50, ... times ``start``, up to ``top`` (vLLM's
    token-count buckets)."""
    bounds: list[float] = []
    scale = start
    while True:
        for step in (1, 2, 5):
            bound = step * scale
            if bound > top:
                return tuple(bounds)
            bounds.append(bound)
        scale *= 10

"""The router's request figures under vLLM's names (:mod:`proto.metric_names`).

The router is their one source: it sees every request end to end, so TTFT, ITL and E2E
are what a client saw, disaggregated or not, and the token counters count each request
once (a prefill worker and the decode worker behind it would count its prompt twice).
Every series carries ``model_name``; the latency histograms add ``mode`` (``disagg``:
remote prefill then decode; ``local``: the decode or mixed worker prefilled itself) and
``worker``: for TTFT the worker that made the first token, for ITL and E2E the one that
decoded. ITL is observed once per streamed chunk: the gap since the previous chunk
divided by the chunk's tokens. Token counters by worker: prompt tokens (and their prefix
cache figures) by the worker that prefilled, generated tokens by the one that decoded.

Prefix-cache figures, in tokens as vLLM counts them: ``prefix_cache_queries`` every prompt
token, ``prefix_cache_hits`` those found in the worker's own cache; the pool is vLLM's
external KV connector: ``external_prefix_cache_queries`` the tokens not found locally,
``external_prefix_cache_hits`` those the pool supplied. ``prompt_tokens_by_source`` splits
every prompt token three ways (:data:`proto.metric_names.PROMPT_SOURCES`).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from proto import worker_pb2 as pb
from proto.metric_names import MODEL_LABEL, PROMPT_SOURCES, VLLM, WORKER_LABEL, one_two_five
from router.flow.types import FlowResult

LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 600.0,
)  # fmt: skip
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 5.0)
TOKEN_BUCKETS = one_two_five(1_000_000)
ABORT = "abort"
"""``finished_reason`` of a flow that ended without one (error, timeout, cancelled), as
vLLM counts an aborted request."""


def itl_of(gap_s: float, tokens: int) -> float:
    """The inter-token latency of a streamed chunk of ``tokens`` tokens that came
    ``gap_s`` after the previous one (a chunk counts as at least one token)."""
    return gap_s / max(1, tokens)


class RequestMetrics:
    """Registered on the router's registry by :class:`router.observability.metrics.RouterMetrics`.

    ``model_name`` labels every observation from the moment it is set (the router sets it
    from the workers' registry records at each poll, before any request can run)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.model_name = ""
        latency = (MODEL_LABEL, "mode", WORKER_LABEL)
        by_worker = (MODEL_LABEL, WORKER_LABEL)
        self.ttft = Histogram(
            f"{VLLM}time_to_first_token_seconds", "Time to first token", latency,
            registry=r, buckets=LATENCY_BUCKETS,
        )  # fmt: skip
        self.itl = Histogram(
            f"{VLLM}inter_token_latency_seconds", "Inter-token latency", latency,
            registry=r, buckets=ITL_BUCKETS,
        )  # fmt: skip
        self.e2e = Histogram(
            f"{VLLM}e2e_request_latency_seconds", "Request latency, end to end", latency,
            registry=r, buckets=LATENCY_BUCKETS,
        )  # fmt: skip
        self.success = Counter(
            f"{VLLM}request_success", "Finished requests by finish reason (abort: ended by "
            "an error, a timeout or the client)", (MODEL_LABEL, "finished_reason"), registry=r,
        )  # fmt: skip
        self.prompt_lengths = Histogram(
            f"{VLLM}request_prompt_tokens", "Prompt tokens of each finished request",
            (MODEL_LABEL,), registry=r, buckets=TOKEN_BUCKETS,
        )  # fmt: skip
        self.generation_lengths = Histogram(
            f"{VLLM}request_generation_tokens", "Generated tokens of each finished request",
            (MODEL_LABEL,), registry=r, buckets=TOKEN_BUCKETS,
        )  # fmt: skip
        self.prompt_tokens = self._counter("prompt_tokens", "Prompt tokens prefilled", r)
        self.generation_tokens = self._counter("generation_tokens", "Tokens generated", r)
        self.by_source = Counter(
            f"{VLLM}prompt_tokens_by_source", "Prompt tokens by where their KV came from "
            "(local_cache_hit, external_kv_transfer: the pool, local_compute)",
            (*by_worker, "source"), registry=r,
        )  # fmt: skip
        self.queries = self._counter("prefix_cache_queries", "Prompt tokens looked up", r)
        self.hits = self._counter("prefix_cache_hits", "Prompt tokens in the local cache", r)
        self.external_queries = self._counter(
            "external_prefix_cache_queries", "Prompt tokens looked up in the pool", r
        )
        self.external_hits = self._counter(
            "external_prefix_cache_hits", "Prompt tokens taken from the pool", r
        )

    @staticmethod
    def _counter(name: str, doc: str, registry: CollectorRegistry) -> Counter:
        """A vLLM token counter by ``model_name`` and ``worker``."""
        return Counter(f"{VLLM}{name}", doc, (MODEL_LABEL, WORKER_LABEL), registry=registry)

    def observe_prefill(self, worker: str, usage: pb.PromptUsage) -> None:
        """Count one prefill's prompt tokens on ``worker``, by source."""
        m = self.model_name
        parts = {"local": usage.local_tokens, "pool": usage.pool_tokens}
        parts["computed"] = usage.computed_tokens
        prompt = usage.prompt_tokens or sum(parts.values())
        for ours, theirs in PROMPT_SOURCES.items():
            self.by_source.labels(m, worker, theirs).inc(parts[ours])
        self.prompt_tokens.labels(m, worker).inc(prompt)
        self.queries.labels(m, worker).inc(prompt)
        self.hits.labels(m, worker).inc(usage.local_tokens)
        self.external_queries.labels(m, worker).inc(max(0, prompt - usage.local_tokens))
        self.external_hits.labels(m, worker).inc(usage.pool_tokens)

    def observe_first_token(self, mode: str, worker: str, seconds: float) -> None:
        self.ttft.labels(self.model_name, mode, worker).observe(seconds)

    def observe_chunk(self, mode: str, worker: str, gap_s: float, tokens: int) -> None:
        self.itl.labels(self.model_name, mode, worker).observe(itl_of(gap_s, tokens))

    def observe_finish(self, result: FlowResult) -> None:
        """A flow ended: its generated tokens (whatever the status), and for a flow that
        ran, its finish reason, lengths and (finished normally) its end-to-end latency."""
        m = self.model_name
        if result.output_tokens:
            self.generation_tokens.labels(m, result.worker_id).inc(result.output_tokens)
        if result.status == "ok":
            self.e2e.labels(m, result.mode, result.worker_id).observe(result.e2e_s)
        self.success.labels(m, result.finish_reason or ABORT).inc()
        self.prompt_lengths.labels(m).observe(result.prompt_tokens)
        self.generation_lengths.labels(m).observe(result.output_tokens)

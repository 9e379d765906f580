"""Per-request records and their aggregates, defined as vLLM's ``bench serve`` defines them.

Pure (no I/O, no torch): the load generator and a simulator fill the same
:class:`RequestRecord` and get the same JSON. Times are seconds from the run's start.

Per request (successful: no error and at least one streamed chunk with ``choices``; every
such chunk counts, even with empty text, as in vLLM):

- TTFT = first chunk time - send time (``start_s``);
- E2E = last chunk time - send time;
- ITL = the gaps between consecutive chunks (all of them, pooled over requests);
- TPOT = (E2E - TTFT) / (output_tokens - 1), for requests with at least 2 output tokens
  (others have no TPOT and are left out of its distribution);
- TBT (Mooncake) = the mean of the request's slowest ``ceil(gaps / 10)`` gaps (the slowest
  10%, at least one); requests with no gap have no TBT.

``output_tokens`` is the usage's ``completion_tokens`` (the number of chunks when the server
sent no usage). Aggregates (:func:`summarize`): ``mean``, ``p50``, ``p90``, ``p99`` of each
(percentiles with linear interpolation between order statistics, numpy's default); request
throughput = completed / duration; output throughput = sum output tokens of completed /
duration; total-token throughput = sum (prompt + output) tokens of completed / duration;
cache hit rate = sum ``cached_tokens`` / sum ``prompt_tokens`` over completed requests that
reported usage (null when none did); rejected = HTTP 429 or 503. SLO attainment is the share
of ALL requests (failed ones count as misses) that a given predicate accepts (:mod:`.slo`);
goodput = requests accepted per second of duration.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

REJECTED_STATUS = (429, 503)


@dataclass(frozen=True)
class RequestRecord:
    """What happened to one request (``chunk_times_s``: arrival of each streamed chunk;
    ``conversation`` and ``turn``: the request's place in a conversation, -1 outside one)."""

    index: int
    arrival_s: float
    prompt_len: int
    max_tokens: int
    group: int
    start_s: float
    end_s: float
    chunk_times_s: tuple[float, ...] = ()
    output_tokens: int = 0
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    error: str | None = None
    status_code: int | None = None
    conversation: int = -1
    turn: int = -1

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.chunk_times_s)

    @property
    def rejected(self) -> bool:
        return self.status_code in REJECTED_STATUS

    @property
    def ttft_s(self) -> float | None:
        return self.chunk_times_s[0] - self.start_s if self.ok else None

    @property
    def e2e_s(self) -> float | None:
        return self.chunk_times_s[-1] - self.start_s if self.ok else None

    @property
    def itl_s(self) -> list[float]:
        t = self.chunk_times_s
        return [b - a for a, b in itertools.pairwise(t)] if self.ok else []

    @property
    def tpot_s(self) -> float | None:
        ttft, e2e = self.ttft_s, self.e2e_s
        if ttft is None or e2e is None or self.output_tokens < 2:
            return None
        return (e2e - ttft) / (self.output_tokens - 1)

    @property
    def tbt_s(self) -> float | None:
        gaps = sorted(self.itl_s, reverse=True)
        if not gaps:
            return None
        slowest = gaps[: -(-len(gaps) // 10)]
        return sum(slowest) / len(slowest)


def percentile(values: Sequence[float], p: float) -> float:
    """The ``p``-th percentile (0..100) with linear interpolation (numpy's default)."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * p / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(frozen=True)
class Distribution:
    """Mean and percentiles of one metric, in seconds (all None with no values)."""

    count: int
    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None


def describe(values: Sequence[float]) -> Distribution:
    if not values:
        return Distribution(0, None, None, None, None)
    pct = [percentile(values, p) for p in (50, 90, 99)]
    return Distribution(len(values), sum(values) / len(values), *pct)


def present(values: Sequence[float | None]) -> list[float]:
    return [v for v in values if v is not None]


def cache_hit_rate(records: Sequence[RequestRecord]) -> float | None:
    """Sum of cached over sum of prompt tokens, over completed requests with usage."""
    used = [r for r in records if r.ok and r.prompt_tokens is not None]
    prompt = sum(r.prompt_tokens or 0 for r in used)
    return sum(r.cached_tokens or 0 for r in used) / prompt if prompt else None


def span_s(records: Sequence[RequestRecord]) -> float:
    """The run's duration as the records see it: first arrival to the last end."""
    if not records:
        return 0.0
    return max(r.end_s for r in records) - min(r.arrival_s for r in records)


@dataclass(frozen=True)
class RunSummary:
    """The aggregates of one run (module docstring: definitions)."""

    requests: int
    completed: int
    failed: int
    rejected: int
    duration_s: float
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    ttft_s: Distribution
    tpot_s: Distribution
    itl_s: Distribution
    e2e_s: Distribution
    tbt_s: Distribution
    cache_hit_rate: float | None
    slo_attainment: float | None
    goodput_rps: float | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def summarize(
    records: Sequence[RequestRecord],
    duration_s: float,
    meets_slo: Callable[[RequestRecord], bool] | None = None,
) -> RunSummary:
    """Aggregate ``records`` of a run that lasted ``duration_s`` (0 gives 0 throughputs)."""
    done = [r for r in records if r.ok]
    output = sum(r.output_tokens for r in done)
    prompt = sum(r.prompt_tokens if r.prompt_tokens is not None else r.prompt_len for r in done)
    per_s = 1.0 / duration_s if duration_s > 0 else 0.0
    good = sum(1 for r in records if meets_slo(r)) if meets_slo else None
    return RunSummary(
        requests=len(records),
        completed=len(done),
        failed=len(records) - len(done),
        rejected=sum(1 for r in records if r.rejected),
        duration_s=duration_s,
        request_throughput=len(done) * per_s,
        output_throughput=output * per_s,
        total_token_throughput=(prompt + output) * per_s,
        ttft_s=describe(present([r.ttft_s for r in done])),
        tpot_s=describe(present([r.tpot_s for r in done])),
        itl_s=describe([gap for r in done for gap in r.itl_s]),
        e2e_s=describe(present([r.e2e_s for r in done])),
        tbt_s=describe(present([r.tbt_s for r in done])),
        cache_hit_rate=cache_hit_rate(done),
        slo_attainment=None if good is None or not records else good / len(records),
        goodput_rps=None if good is None else good * per_s,
    )


def bucket_label(value: int, edges: Sequence[int]) -> str:
    """``"<e0"``, ``"e0-e1"``, ..., ``">=en"`` for sorted ``edges``; lower edges inclusive."""
    if not edges or value < edges[0]:
        return f"<{edges[0]}" if edges else "all"
    for lo, hi in itertools.pairwise(edges):
        if lo <= value < hi:
            return f"{lo}-{hi}"
    return f">={edges[-1]}"


def by_bucket(
    records: Sequence[RequestRecord], key: Callable[[RequestRecord], int], edges: Sequence[int]
) -> dict[str, list[RequestRecord]]:
    """Records grouped by the bucket of ``key(record)``, buckets in ascending order."""
    groups: dict[str, list[RequestRecord]] = {}
    for r in sorted(records, key=key):
        groups.setdefault(bucket_label(key(r), edges), []).append(r)
    return groups


def bucketed(
    records: Sequence[RequestRecord],
    duration_s: float,
    edges: Sequence[int],
    key: Callable[[RequestRecord], int],
    meets_slo: Callable[[RequestRecord], bool] | None = None,
) -> dict[str, dict[str, Any]]:
    """:func:`summarize` per bucket (throughputs over the whole run's duration)."""
    return {
        label: summarize(group, duration_s, meets_slo).to_json()
        for label, group in by_bucket(records, key, edges).items()
    }

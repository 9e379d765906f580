"""Service-level objectives: per-request targets, attainment, and DistServe's goodput. Pure.

- A request meets its :class:`SloTargets` when it succeeded and each target that is set
  holds: TTFT <= ``ttft_s``, TPOT <= ``tpot_s``, TBT <= ``tbt_s``. A request without a TPOT
  (one output token) or TBT (one chunk) meets that target vacuously: it had no decode gaps.
- Absolute targets (:class:`AbsoluteSlo`) are the same for every request.
- Relative targets (:class:`RelativeSlo`, Mooncake's "TTFT within 10x, TBT within 5x of the
  unloaded latency") come from a calibration run that sent a sample of the workload one
  request at a time: for each INPUT-length bucket, the target is the factor times the
  MEDIAN unloaded TTFT (resp. TBT) of the calibration requests in that bucket; a bucket with
  no calibration sample takes the median over all calibration requests. Only TTFT and TBT
  are relative; TPOT stays unset.
- :func:`sweep_goodput` (DistServe): given SLO attainment at several request rates, the
  highest rate whose attainment is >= ``threshold`` (0.9), and the interpolated rate: with
  rates in increasing order, take the passing prefix (every rate up to r_k passes); if the
  next rate r_{k+1} fails, interpolate attainment linearly between r_k and r_{k+1} to the
  rate where it equals the threshold; if every rate passes, it is the highest rate (a lower
  bound); if the lowest rate fails, it is None.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kvserve.loadgen.metrics import RequestRecord, bucket_label, present


@dataclass(frozen=True)
class SloTargets:
    """Upper bounds in seconds; None means "not checked"."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    tbt_s: float | None = None


def within(value: float | None, target: float | None) -> bool:
    return target is None or value is None or value <= target


def meets(record: RequestRecord, targets: SloTargets) -> bool:
    """Whether ``record`` succeeded and met every set target (module docstring)."""
    return (
        record.ok
        and within(record.ttft_s, targets.ttft_s)
        and within(record.tpot_s, targets.tpot_s)
        and within(record.tbt_s, targets.tbt_s)
    )


class Slo(Protocol):
    def targets(self, record: RequestRecord) -> SloTargets: ...

    def meets(self, record: RequestRecord) -> bool: ...

    def to_json(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class AbsoluteSlo:
    """The same targets for every request."""

    fixed: SloTargets

    def targets(self, record: RequestRecord) -> SloTargets:
        return self.fixed

    def meets(self, record: RequestRecord) -> bool:
        return meets(record, self.fixed)

    def to_json(self) -> dict[str, Any]:
        return {"kind": "absolute", **self.fixed.__dict__}


@dataclass(frozen=True)
class RelativeSlo:
    """Targets per input-length bucket from unloaded latencies (module docstring)."""

    ttft_factor: float
    tbt_factor: float
    edges: tuple[int, ...]
    per_bucket: dict[str, SloTargets] = field(default_factory=dict)
    fallback: SloTargets = SloTargets()

    def targets(self, record: RequestRecord) -> SloTargets:
        return self.per_bucket.get(bucket_label(record.prompt_len, self.edges), self.fallback)

    def meets(self, record: RequestRecord) -> bool:
        return meets(record, self.targets(record))

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "relative",
            "basis": "factor x median unloaded latency per input-length bucket",
            "ttft_factor": self.ttft_factor,
            "tbt_factor": self.tbt_factor,
            "input_buckets": list(self.edges),
            "per_bucket": {k: v.__dict__ for k, v in self.per_bucket.items()},
            "fallback": self.fallback.__dict__,
        }


def scaled_median(values: Sequence[float | None], factor: float) -> float | None:
    got = present(values)
    return factor * statistics.median(got) if got else None


def relative_slo(
    unloaded: Sequence[RequestRecord], ttft_factor: float, tbt_factor: float, edges: Sequence[int]
) -> RelativeSlo:
    """:class:`RelativeSlo` from calibration records sent one at a time."""
    done = [r for r in unloaded if r.ok]
    if not done:
        raise ValueError("relative SLOs need at least one successful unloaded request")

    def targets(group: Sequence[RequestRecord]) -> SloTargets:
        return SloTargets(
            ttft_s=scaled_median([r.ttft_s for r in group], ttft_factor),
            tbt_s=scaled_median([r.tbt_s for r in group], tbt_factor),
        )

    buckets: dict[str, list[RequestRecord]] = {}
    for r in done:
        buckets.setdefault(bucket_label(r.prompt_len, edges), []).append(r)
    return RelativeSlo(
        ttft_factor,
        tbt_factor,
        tuple(edges),
        {label: targets(group) for label, group in buckets.items()},
        targets(done),
    )


@dataclass(frozen=True)
class SweepGoodput:
    threshold: float
    highest_passing_rate: float | None
    interpolated_rate: float | None


def sweep_goodput(
    points: Sequence[tuple[float, float | None]], threshold: float = 0.9
) -> SweepGoodput:
    """DistServe goodput from ``(rate, attainment)`` points (module docstring)."""
    ordered = sorted((rate, a if a is not None else 0.0) for rate, a in points)
    passing = [rate for rate, a in ordered if a >= threshold]
    highest = max(passing) if passing else None
    interpolated: float | None = None
    for i, (rate, a) in enumerate(ordered):
        if a < threshold:
            if i > 0:
                interpolated = interpolate(ordered[i - 1], (rate, a), threshold)
            break
        interpolated = rate
    return SweepGoodput(threshold, highest, interpolated)


def interpolate(lo: tuple[float, float], hi: tuple[float, float], threshold: float) -> float:
    """The rate between a passing ``lo`` and a failing ``hi`` point where attainment crosses
    ``threshold`` (``lo``'s rate when ``hi``'s rate is infinite or attainments are equal)."""
    (r0, a0), (r1, a1) = lo, hi
    if math.isinf(r1) or a0 == a1:
        return r0
    return r0 + (r1 - r0) * (a0 - threshold) / (a0 - a1)

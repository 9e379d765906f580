"""A workload whose shape changes midway, and SLO attainment over time. Pure.

Used by ``kvserve bench shift`` (a live cluster) and ``kvserve sim shift`` (the simulator)
alike, so both replay exactly the same requests:

- :func:`shift_requests`: phases in order, each a :class:`Phase` (a synthetic shape, a
  Poisson rate and a duration); phase ``k``'s requests get seed ``seed + k`` and arrive
  in ``[start_k, start_k + duration_k)``; indices run over the whole workload and
  ``group`` holds the phase number;
- :func:`attainment_over_time`: the share of requests meeting the SLO among those that
  *arrived* in a sliding window ending at each tick (failed requests count as misses).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvserve.loadgen.arrivals import poisson_arrivals
from kvserve.loadgen.metrics import RequestRecord
from kvserve.loadgen.workloads import (
    Lengths,
    RequestSpec,
    SyntheticShape,
    synthetic_requests,
)

PHASE = re.compile(r"^(\d+):(\d+)@([0-9.]+)x([0-9.]+)$")


@dataclass(frozen=True)
class Phase:
    """``input``:``output`` token lengths (``spread`` around them) at ``rate`` req/s for
    ``duration_s`` seconds."""

    input_len: int
    output_len: int
    rate: float
    duration_s: float
    spread: float = 0.25

    def __post_init__(self) -> None:
        if self.rate <= 0 or self.duration_s <= 0:
            raise ValueError(f"a phase needs a positive rate and duration, got {self}")

    @property
    def shape(self) -> SyntheticShape:
        return SyntheticShape(
            Lengths(self.input_len, self.spread), Lengths(self.output_len, self.spread)
        )

    @property
    def label(self) -> str:
        return f"{self.input_len}:{self.output_len}@{self.rate:g}"


def parse_phase(text: str, spread: float = 0.25) -> Phase:
    """``"512:16@0.25x150"``: 512-token prompts, 16-token answers, 0.25 req/s for 150 s."""
    match = PHASE.match(text)
    if not match:
        raise ValueError(f"a phase looks like INPUT:OUTPUT@RATExSECONDS, got {text!r}")
    i, o, rate, duration = match.groups()
    return Phase(int(i), int(o), float(rate), float(duration), spread)


def phase_starts(phases: Sequence[Phase]) -> list[float]:
    starts, t = [], 0.0
    for phase in phases:
        starts.append(t)
        t += phase.duration_s
    return starts


def shift_requests(phases: Sequence[Phase], seed: int, vocab: int) -> list[RequestSpec]:
    """Every phase's requests, in arrival order (module docstring)."""
    specs: list[RequestSpec] = []
    for k, (phase, start) in enumerate(zip(phases, phase_starts(phases), strict=True)):
        times = [
            t
            for t in poisson_arrivals(
                10 * max(1, round(phase.rate * phase.duration_s)), phase.rate, seed + k
            )
            if t < phase.duration_s
        ]
        shapes = {"prefill-heavy": phase.shape}
        chosen = synthetic_requests("prefill-heavy", len(times), seed + k, shapes, vocab)
        for spec, t in zip(chosen, times, strict=True):
            specs.append(
                RequestSpec(len(specs), start + t, spec.prompt_token_ids, spec.max_tokens, group=k)
            )
    return specs


def attainment_over_time(
    records: Sequence[RequestRecord],
    meets: Callable[[RequestRecord], bool],
    window_s: float,
    tick_s: float,
) -> list[tuple[float, float | None]]:
    """``(t, attainment)`` every ``tick_s`` over the run: among requests that arrived in
    ``(t - window_s, t]`` (None when there is none)."""
    if not records:
        return []
    end = max(r.arrival_s for r in records)
    points: list[tuple[float, float | None]] = []
    t = tick_s
    while t <= end + tick_s:
        window = [r for r in records if t - window_s < r.arrival_s <= t]
        share = sum(1 for r in window if meets(r)) / len(window) if window else None
        points.append((round(t, 6), share))
        t += tick_s
    return points

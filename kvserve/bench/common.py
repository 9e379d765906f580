"""What the ``kvserve bench`` verbs share besides the JSON (:func:`kvserve.report.emit`):
random prompts, timing a piece of work, and the headline that sets a measurement against
the baseline measured in the same run."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

from kvserve.report import median


def random_tokens(rng: random.Random, n: int, vocab: int, low: int = 0) -> list[int]:
    """``n`` token ids drawn from ``[low, vocab)`` by ``rng``."""
    return [rng.randrange(low, vocab) for _ in range(n)]


def seconds(work: Callable[[], object]) -> float:
    """Wall seconds one call of ``work`` takes."""
    t0 = time.perf_counter()
    work()
    return time.perf_counter() - t0


def median_seconds(work: Callable[[], object], repeat: int, warmup: bool = True) -> float:
    """Median wall seconds of ``repeat`` calls of ``work`` (after one untimed call)."""
    if warmup:
        work()
    return median([seconds(work) for _ in range(repeat)])


def ratio_headline(
    metric: str,
    value: float | None,
    baseline: float | None,
    target: float | None = None,
    digits: int | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A headline: ``metric``, ``value`` against the same run's ``baseline``, their
    ``ratio`` (None without both; rounded to ``digits`` when given), ``target`` and
    whatever else the bench adds, in that order."""
    ratio = value / baseline if value is not None and baseline else None
    if ratio is not None and digits is not None:
        ratio = round(ratio, digits)
    return {
        "metric": metric,
        "value": value,
        "baseline": baseline,
        "ratio": ratio,
        "target": target,
        **extra,
    }

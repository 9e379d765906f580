"""The shape and pool of a deployment started on this machine, shared by the benchmarks
that start one (``bench compare``, ``shift``, ``pressure``, ``peer``) and the simulator's
twin of it (``sim serve``, ``shift``, ``ratio``, ``validate``): :func:`parse_deployment`
reads a split such as ``1p1d``, :class:`SegmentConfig` is the pool memory per worker. Pure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from kvserve.settings import BENCH_ENV

SPLIT = re.compile(r"^(?:(\d+)p)?(?:(\d+)d)?(?:(\d+)m)?$")


def parse_deployment(text: str) -> tuple[int, int, int]:
    """``"1p1d"`` -> (prefill, decode, mixed) = (1, 1, 0); ``"2m"`` -> (0, 0, 2)."""
    match = SPLIT.match(text)
    if not match or not text:
        raise ValueError(f"deployment must look like 1p1d, 2m or 1p1d1m, got {text!r}")
    prefill, decode, mixed = (int(g) if g else 0 for g in match.groups())
    return prefill, decode, mixed


SEGMENT_MIB = 256
"""Pool memory each worker of a cluster started here contributes (``kvserve up``, the
benchmarks' clusters): with 2 workers and their KV caches it fits a 2-core, 24 GiB machine."""


@dataclass(frozen=True)
class SegmentConfig:
    """The pool of the clusters a benchmark starts (``bench compare``, ``shift``,
    ``pressure``, ``peer``, ``sim validate``).

    - ``segment_mib``: pool memory per worker.
    """

    env_prefix: ClassVar[str] = BENCH_ENV
    segment_mib: int = SEGMENT_MIB

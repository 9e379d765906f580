"""The settings of the P:D ratio controller (:mod:`router.control.ratio`): SLOs, hysteresis and
pool bounds, checked on construction. Pure: no I/O, no clock."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class RatioConfig:
    """SLOs, hysteresis and bounds of the ratio controller (the decision rules are in
    :mod:`router.control.ratio`). The router's flags are ``--controller-<field>``.

    - ``ttft_slo_s``: the time-to-first-token SLO; 2 s, a common interactive-chat target
      that leaves a CPU cluster room to queue a request or two.
    - ``tpot_slo_s``: the time-per-output-token SLO; 0.1 s (10 tokens/s, faster than
      anyone reads).
    - ``target``: the attainment (share of requests within an SLO) below which that SLO
      counts as missed.
    - ``window_s``: the requests judged are those finished in the last this many seconds
      (30 s holds enough requests at a few per second for a stable attainment).
    - ``min_samples``: fewer samples than this in the window give no verdict.
    - ``patience``: consecutive evaluations with the same verdict before a move.
    - ``cooldown_s``: nothing moves for this long after a completed change (60 s, twice
      the window, lets the window refill with the new ratio).
    - ``min_prefill`` / ``max_prefill``: bounds on the prefill pool's size.
    - ``min_decode`` / ``max_decode``: bounds on the decode pool's size (at least 1).
    """

    ttft_slo_s: float = 2.0
    tpot_slo_s: float = 0.1
    target: float = 0.9
    window_s: float = 30.0
    min_samples: int = 5
    patience: int = 2
    cooldown_s: float = 60.0
    min_prefill: int = 0
    max_prefill: int = 64
    min_decode: int = 1
    max_decode: int = 64

    def __post_init__(self) -> None:
        for name in ("ttft_slo_s", "tpot_slo_s", "window_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number of seconds, got {value}")
        if not 0 < self.target <= 1:
            raise ValueError(f"target must be an attainment in (0, 1], e.g. 0.9, got {self.target}")
        if self.min_samples < 1:
            raise ValueError(f"min_samples must be >= 1, got {self.min_samples}")
        if self.patience < 1:
            raise ValueError(f"patience must be >= 1 evaluation, got {self.patience}")
        if not (math.isfinite(self.cooldown_s) and self.cooldown_s >= 0):
            raise ValueError(f"cooldown_s must be >= 0 seconds, got {self.cooldown_s}")
        if not 0 <= self.min_prefill <= self.max_prefill:
            raise ValueError(
                f"need 0 <= min_prefill <= max_prefill, got {self.min_prefill}, {self.max_prefill}"
            )
        if not 1 <= self.min_decode <= self.max_decode:
            raise ValueError(
                "need 1 <= min_decode <= max_decode (a cluster always needs a decode worker), "
                f"got {self.min_decode}, {self.max_decode}"
            )

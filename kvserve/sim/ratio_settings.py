"""The settings of ``kvserve sim ratio`` (:class:`RatioSimConfig`, and the simulated
deployment's with :data:`DEPLOY_DEFAULTS`); :mod:`kvserve.sim.ratio` runs it."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from kvserve.loadgen.options import ReportConfig, WorkloadConfig
from kvserve.settings import add_config_args, setting
from kvserve.sim import SIM_ENV, deploy

DEFAULT_RATES = [float(2**i) for i in range(1, 8)]


@dataclass(frozen=True, repr=False)
class Mix:
    """Mean prompt and answer lengths of one workload."""

    input: int
    output: int

    @property
    def label(self) -> str:
        return f"{self.input}:{self.output}"

    def __repr__(self) -> str:
        return self.label


def parse_mix(text: str) -> Mix:
    """``"8192:32"`` -> ``Mix(8192, 32)``."""
    parts = text.split(":")
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"a mix is INPUT:OUTPUT token counts > 0, got {text!r}")
    return Mix(int(parts[0]), int(parts[1]))


DEFAULT_MIXES = [parse_mix(m) for m in ("8192:32", "4096:64", "2048:128", "1024:256", "512:512")]


@dataclass(frozen=True)
class RatioSimConfig:
    """The splits, mixes, rates and SLOs of ``kvserve sim ratio``.

    - ``instances``: instances N to split;
    - ``mixes``: INPUT:OUTPUT mean lengths, prompt-heavy first;
    - ``spread``: lengths uniform mean*(1±s);
    - ``rates``: req/s offered to the whole cluster;
    - ``num_requests``: requests per mix, split and rate;
    - ``seed``: seed of the requests and arrivals;
    - ``slo_ttft_s``: SLO on time to first token;
    - ``slo_tpot_s``: SLO on time per output token;
    - ``goodput_threshold``: SLO attainment a rate needs to count for goodput;
    - ``band_share``: band: splits with goodput >= this share of the best;
    - ``colocated``: also run N mixed instances (the baseline);
    - ``out``: folder for ratio.png.
    """

    env_prefix: ClassVar[str] = SIM_ENV
    instances: int = 8
    mixes: list[Mix] = setting(DEFAULT_MIXES, parse=parse_mix)
    spread: float = WorkloadConfig.spread
    rates: list[float] = setting(DEFAULT_RATES)
    num_requests: int = 128
    seed: int = 0
    slo_ttft_s: float = 2.0
    slo_tpot_s: float = 0.03
    goodput_threshold: float = ReportConfig.goodput_threshold
    band_share: float = 0.9
    colocated: bool = True
    out: Path | None = None


DEPLOY_DEFAULTS = {
    "kv_cache_mib": 0,
    "max_num_batched_tokens": 2048,
    "max_num_seqs": 256,
    "policy": "round_robin",
}
"""The simulated deployment's defaults for ``sim ratio`` (module docstring)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ratio sweep's settings and the simulated deployment's (:data:`DEPLOY_DEFAULTS`)."""
    add_config_args(parser, RatioSimConfig)
    deploy.add_arguments(parser, defaults=DEPLOY_DEFAULTS)
    parser.set_defaults(concurrency=0)  # not a setting here: every burst at once

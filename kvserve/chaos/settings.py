"""The settings of ``kvserve chaos`` (:class:`ChaosConfig`; :mod:`kvserve.chaos.run` runs it)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import ClassVar

from kvpool.config import STAGING_SETTINGS, PoolConfig
from kvserve.cluster.up_settings import UpConfig
from kvserve.settings import add_config_args, setting
from workers.config import VllmOptions, WorkerConfig

DEFAULT_FAULTS = ("kill-decode", "kill-prefill", "freeze-decode", "kill-master", "kill-redis")
FAULTS = (*DEFAULT_FAULTS, "kill-router", "kill-master-leader")
"""Every fault; ``kill-router`` needs ``--routers`` 2 or more and ``kill-master-leader``
``--pool-masters`` 2 or more, so they are not defaults."""


@dataclass(frozen=True)
class ChaosConfig:
    """The load, the faults and the cluster of ``kvserve chaos``.

    - ``requests``: requests sent at most;
    - ``concurrency``: requests in flight;
    - ``interval_s``: least seconds between the starts of two requests (0: as fast as the
      concurrency allows); a slower load leaves room for more faults;
    - ``max_seconds``: stop sending after this;
    - ``fault_every_s``: mean pause between faults;
    - ``down_s``: how long a killed process stays down;
    - ``freeze_s``: how long a frozen worker stays;
    - ``hang_s``: no answer after this: hung;
    - ``faults``: the faults to pick from;
    - ``fault_order``: ``random`` picks each fault at random, ``cycle`` takes them in the
      order given, again and again (every kind in a short run: a vLLM worker takes a minute
      to come back, so a run has few faults);
    - ``prefill`` / ``decode``: prefill and decode workers;
    - ``routers``: routers behind nginx (2 or more: ``kill-router`` kills one of them at
      random; the requests it was serving are counted as lost with their router);
    - ``pool_masters``: pool masters (2 or more: Mooncake's HA mode over etcd;
      ``kill-master-leader`` kills the leading one, its detection is another taking the
      lead);
    - ``redis_ha``: the registry as a primary, a replica and three Sentinels: ``kill-redis``
      then kills the primary, its detection is the Sentinels naming another one, and the
      killed node comes back as a replica;
    - ``model``: model directory (default: the tiny model);
    - ``block_tokens``: tokens per KV block of the workers (0: the engine's smallest, 16
      for kvserve's, 32 for vLLM's CPU kernels);
    - ``seed``: seed of the workload and of the fault schedule;
    - ``log_dir``: process logs (default: a temporary folder);
    - ``json``: also write the results as JSON to this file.
    """

    env_prefix: ClassVar[str] = "KVSERVE_CHAOS_"
    requests: int = 500
    concurrency: int = 4
    interval_s: float = 0.0
    max_seconds: float = 1200.0
    fault_every_s: float = 8.0
    down_s: float = 2.0
    freeze_s: float = 8.0
    hang_s: float = 120.0
    faults: list[str] = setting(list(DEFAULT_FAULTS), choices=FAULTS)
    fault_order: str = setting("random", choices=("random", "cycle"))
    prefill: int = UpConfig.prefill
    decode: int = 2
    routers: int = UpConfig.routers
    pool_masters: int = UpConfig.pool_masters
    redis_ha: bool = UpConfig.redis_ha
    model: str = ""
    block_tokens: int = 0
    seed: int = 0
    log_dir: str = UpConfig.log_dir
    json: str = ""

    def __post_init__(self) -> None:
        if self.routers < 1:
            raise ValueError(f"routers must be >= 1, got {self.routers}")
        if "kill-router" in self.faults and self.routers < 2:
            raise ValueError("kill-router needs --routers 2 or more (one router is the door)")
        if "kill-master-leader" in self.faults and self.pool_masters < 2:
            raise ValueError("kill-master-leader needs --pool-masters 2 or more")


SETTINGS = (ChaosConfig,)
CHAOS_POOL = PoolConfig(pool_segment_mib=128, pool_local_buffer_mib=16)
"""The pool memory of the chaos cluster's processes (``--kv-staging`` and its memory from
the flags: ``--kv-staging always`` runs the faults over the host staging path)."""


SMALLEST_BLOCK = {"kvserve": 16, "vllm": 32}
"""Tokens per block when ``--block-tokens`` is 0, by engine."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The chaos settings, the pool's staging settings, the workers' engine (``--engine
    vllm`` and vLLM's settings)."""
    add_config_args(parser, ChaosConfig)
    add_config_args(parser, PoolConfig, only=STAGING_SETTINGS)
    add_config_args(parser, WorkerConfig, only=("engine",))
    add_config_args(parser, VllmOptions)

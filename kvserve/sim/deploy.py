"""The simulated deployment: its settings (:class:`SimDeployConfig`), and the
:class:`~kvserve.sim.cluster.SimCluster` they describe (workers of each role with the engine
settings of a real worker, the pool, the link, the router's policy and timing, optionally
the ratio controller).

Engine flags carry the names and defaults of :class:`workers.config.EngineConfig`, so one
command line describes a real worker and its simulated twin alike. The cost is
``--cost roofline:HARDWARE:MODEL`` (a GPU at any scale) or a file written by ``kvserve sim
calibrate`` (our own CPU workers); the KV's bytes per token come from the model's shape and
dtype. ``--kv-cache-mib 0`` with a roofline cost sizes the cache as a GPU server would: 90%
of the device memory less the weights.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from kvserve.cluster.deployment import parse_deployment
from kvserve.settings import add_config_args
from kvserve.sim import SIM_ENV
from kvserve.sim.analysis_common import GB, CostConfig, CostSetup, resolve_cost
from kvserve.sim.cluster import SimCluster
from kvserve.sim.engine import KVCosts, SimEngine, SimPool
from kvserve.sim.link import Link
from kvserve.sim.request import Timing
from router.config import RouterConfig
from router.control.ratio import RatioController
from router.placement.policies import make_policy
from workers.config import EngineConfig
from workers.core.scheduler import SchedulerConfig

GPU_MEMORY_SHARE = 0.9
DEFAULT_COST = "roofline:h100:llama3-8b"


@dataclass(frozen=True)
class SimDeployConfig:
    """The simulated deployment (``sim serve``, ``shift``, ``validate``, ``ratio``).

    - ``workers``: split, e.g. 1p1d, 2p6d, 4m;
    - ``cost``: roofline:HW:MODEL or calibrated JSON;
    - ``decode_cost``: another cost for decode and mixed workers (e.g. calibrated on a
      decode worker's step log; default: --cost);
    - ``tp``: tensor-parallel devices per instance;
    - ``policy``: router placement policy;
    - ``disagg_threshold_tokens``: the router's: prompts with at most this many uncached
      tokens may be prefilled by the decode worker;
    - ``link_gbps``: KV link GB/s (per worker);
    - ``link_latency_s``: KV link latency;
    - ``hop_s``: one message between processes;
    - ``heartbeat_s``: load report period;
    - ``pool_capacity_blocks``: pool capacity in blocks (0: unbounded).
    """

    env_prefix: ClassVar[str] = SIM_ENV
    workers: str = "1p1d"
    cost: str = DEFAULT_COST
    decode_cost: str = ""
    tp: int = CostConfig.tp
    policy: str = RouterConfig.policy
    disagg_threshold_tokens: int = RouterConfig.disagg_threshold_tokens
    link_gbps: float = 12.5
    link_latency_s: float = 1e-5
    hop_s: float = Timing.hop_s
    heartbeat_s: float = Timing.heartbeat_s
    pool_capacity_blocks: int = 0


ENGINE_FIELDS = (
    *("block_tokens", "kv_cache_mib", "num_kv_blocks", "max_num_seqs"),
    *("max_num_batched_tokens", "max_model_len", "kv_streaming"),
)
"""The :class:`EngineConfig` settings a simulated worker reads (``--kv-cache-mib 0`` with a
roofline cost: 90% of the device memory less the weights; ``--max-model-len 0``: 128k)."""


def add_arguments(
    p: argparse.ArgumentParser,
    engine_flags: bool = True,
    defaults: Mapping[str, Any] | None = None,
) -> None:
    """The deployment's flags (``engine_flags=False`` when the caller already added every
    :class:`EngineConfig` flag, as ``kvserve sim validate`` does), ``defaults`` replacing
    the fields' defaults (below variables and flags)."""
    add_config_args(p, SimDeployConfig, defaults=defaults)
    if engine_flags:
        add_config_args(p, EngineConfig, only=ENGINE_FIELDS, defaults=defaults)


def num_blocks(args: argparse.Namespace, setup: CostSetup) -> int:
    per_block = int(args.block_tokens) * setup.model.kv_bytes_per_token(setup.dtype_bytes)
    if args.num_kv_blocks:
        return int(args.num_kv_blocks)
    if args.kv_cache_mib:
        return max(1, (int(args.kv_cache_mib) << 20) // per_block)
    if setup.memory_bytes is None:
        raise ValueError("--kv-cache-mib 0 needs a roofline cost (a device memory size)")
    weights = setup.model.params * setup.dtype_bytes
    free = setup.memory_bytes * GPU_MEMORY_SHARE - weights
    if free <= per_block:
        raise ValueError(f"the model ({weights / GB:.1f} GB) leaves no KV memory on the device")
    return int(free // per_block)


def build(
    args: argparse.Namespace, controller: RatioController | None = None
) -> tuple[SimCluster, dict[str, Any]]:
    """The cluster the flags describe, and its conditions for the JSON."""
    setup = resolve_cost(args.cost, args.tp)
    prefill, decode, mixed = parse_deployment(args.workers)
    max_len = args.max_model_len or 131072
    config = SchedulerConfig(
        num_blocks=num_blocks(args, setup),
        block_tokens=args.block_tokens,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=max_len,
    )
    kv = KVCosts(
        bytes_per_token=setup.model.kv_bytes_per_token(setup.dtype_bytes),
        layers=setup.model.layers,
        link=Link(args.link_gbps * GB, args.link_latency_s),
        streaming=args.kv_streaming,
    )
    pool = SimPool(args.pool_capacity_blocks or None)
    roles = ["prefill"] * prefill + ["decode"] * decode + ["mixed"] * mixed
    decode_cost = resolve_cost(args.decode_cost, args.tp).cost if args.decode_cost else setup.cost
    engines = [
        SimEngine(
            f"{role[0]}{i}",
            role,
            config,
            setup.cost if role == "prefill" else decode_cost,
            kv,
            pool,
            max_len,
        )
        for i, role in enumerate(roles)
    ]
    policy = make_policy(args.policy, args.disagg_threshold_tokens)
    timing = Timing(args.hop_s, args.heartbeat_s, getattr(args, "controller_interval_s", 5.0))
    cluster = SimCluster(engines, policy, timing, controller, args.concurrency)
    conditions = {
        "simulated": True,
        "workers": args.workers,
        "cost": args.cost,
        "decode_cost": args.decode_cost or args.cost,
        "tp": args.tp,
        "model_shape": setup.model.name,
        "kv_bytes_per_token": kv.bytes_per_token,
        "scheduler": vars(config),
        "policy": args.policy,
        "disagg_threshold_tokens": args.disagg_threshold_tokens,
        "link_gbps": args.link_gbps,
        "link_latency_s": args.link_latency_s,
        "kv_streaming": args.kv_streaming,
        "hop_s": args.hop_s,
        "heartbeat_s": args.heartbeat_s,
        "pool_capacity_blocks": args.pool_capacity_blocks or None,
    }
    return cluster, conditions

"""The simulated deployment: its flags, and the :class:`~kvserve.sim.cluster.SimCluster` they
describe (workers of each role with the engine settings of a real worker, the pool, the link,
the router's policy and timing, optionally the ratio controller).

Engine flags carry the names and defaults of :class:`workers.config.EngineConfig`, so one
command line describes a real worker and its simulated twin alike. The cost is
``--cost roofline:HARDWARE:MODEL`` (a GPU at any scale) or a file written by ``kvserve sim
calibrate`` (our own CPU workers); the KV's bytes per token come from the model's shape and
dtype. ``--kv-cache-mib 0`` with a roofline cost sizes the cache as a GPU server would: 90%
of the device memory less the weights.
"""

from __future__ import annotations

import argparse
from typing import Any

from kvserve.bench.compare import parse_deployment
from kvserve.sim.analysis_common import GB, CostSetup, resolve_cost
from kvserve.sim.cluster import SimCluster
from kvserve.sim.engine import KVCosts, SimEngine, SimPool
from kvserve.sim.link import Link
from kvserve.sim.request import Timing
from router.conductor import make_policy
from router.ratio import RatioController
from workers.config import EngineConfig
from workers.scheduler import SchedulerConfig

GPU_MEMORY_SHARE = 0.9
DEFAULT_COST = "roofline:h100:llama3-8b"


def add_arguments(p: argparse.ArgumentParser, engine_flags: bool = True) -> None:
    """The deployment's flags (``engine_flags=False`` when the caller already added every
    :class:`EngineConfig` flag, as ``kvserve sim validate`` does)."""
    p.add_argument("--workers", default="1p1d", help="split, e.g. 1p1d, 2p6d, 4m")
    p.add_argument("--cost", default=DEFAULT_COST, help="roofline:HW:MODEL or calibrated JSON")
    p.add_argument(
        "--decode-cost",
        default="",
        help="another cost for decode and mixed workers (e.g. calibrated on a decode worker's "
        "step log; default: --cost)",
    )
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel devices per instance")
    p.add_argument("--policy", default="cache_aware", help="router placement policy")
    p.add_argument("--disagg-threshold-tokens", type=int, default=256)
    p.add_argument("--link-gbps", type=float, default=12.5, help="KV link GB/s (per worker)")
    p.add_argument("--link-latency-s", type=float, default=1e-5)
    p.add_argument("--hop-s", type=float, default=1e-3, help="one message between processes")
    p.add_argument("--heartbeat-s", type=float, default=1.0, help="load report period")
    p.add_argument("--pool-capacity-blocks", type=int, default=0, help="0: unbounded")
    if engine_flags:
        d = EngineConfig()
        p.add_argument("--block-tokens", type=int, default=d.block_tokens)
        p.add_argument(
            "--kv-cache-mib",
            type=int,
            default=d.kv_cache_mib,
            help="per worker (0 with a roofline cost: 90%% of memory - weights)",
        )
        p.add_argument("--num-kv-blocks", type=int, default=d.num_kv_blocks)
        p.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs)
        p.add_argument("--max-num-batched-tokens", type=int, default=d.max_num_batched_tokens)
        p.add_argument("--max-model-len", type=int, default=0, help="0: 128k")
        p.add_argument("--kv-streaming", action=argparse.BooleanOptionalAction, default=True)


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

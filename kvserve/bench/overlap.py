"""``kvserve bench overlap``: how much of the KV transfer layer-wise streaming hides.

Starts its own ``mooncake_master`` and, in this process, a prefill engine and a decode engine
per mode, each a pool member. For every prompt length and repetition, with the modes
interleaved, one fresh prompt (nothing cached anywhere) is handed off
(:mod:`kvserve.bench.handoff`):

- ``after``: streaming off. The prefill computes, then writes every layer of every block to
  the pool; the decode side, given the first token, reads them all. Nothing overlaps, so
  ``transfer = write exposed + adopt`` is the whole transfer time;
- ``streaming``: each layer is written while the next computes, and the decode side
  (reserved before the prefill) reads each (block, layer) object as soon as it lands.
  ``exposed = write exposed + adopt`` is what remains between the end of compute and the
  decode side holding the KV.

- ``push`` (``--modes``): a direct push on the same engines as ``streaming`` (the decode
  side offers its reserved pages, the prefill writes each layer there as it computes and
  the pool in the background; the decode side checks its pages against the pushed metas).
  ``exposed = write exposed + adopt`` as for ``streaming``.

``hidden = 1 - exposed(streaming) / transfer(after)``, from the medians; also the prefill
slowdown streaming causes (the transfer threads share the machine's cores with the compute;
run with ``--threads 1`` on 2 cores to leave one core to them, as a pinned worker pair
would). With ``push`` and ``streaming`` both run: per length, the exposed transfer of each
(median) and their TTFT (the prefill engine's first token, p50 / p90), and the headline is
exposed(streaming) / exposed(push) at the worst length. Conditions: model, lengths, modes,
block size, chunk budget, threads and repetitions.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
from typing import Any, ClassVar

from kvpool.config import STAGING_SETTINGS, PoolConfig
from kvserve.bench.common import scratch_pool
from kvserve.bench.handoff import Handoff, handoff
from kvserve.loadgen.metrics import percentile
from kvserve.loadgen.workloads import random_tokens
from kvserve.report import emit, log, median
from kvserve.settings import BENCH_ENV, add_config_args, config_from_args, setting
from workers.config import EngineConfig
from workers.core.sequence import SamplingParams
from workers.engine.engine import Engine

MODES = ("after", "streaming", "push")
LEASE_S = 3600.0
"""The decode reservation's lease here: longer than any prefill measured (an 8k-token
SmolLM2 prefill takes over a minute on one CPU core), so no landing or push is cut short
by it (a push stops at its target's lease, a landing at its reservation's)."""


@dataclasses.dataclass(frozen=True)
class OverlapBenchConfig:
    """The prompts of ``kvserve bench overlap``.

    - ``lengths``: prompt lengths, one measurement each;
    - ``modes``: how the KV is handed off: ``after`` (streaming off: written after compute,
      read after the first token), ``streaming`` (through the pool layer by layer, landed
      as it arrives), ``push`` (written straight into the decode engine's pages layer by
      layer, the pool in the background; on the same engines as ``streaming``);
    - ``repeat``: runs per measurement (the median is reported);
    - ``seed``: seed of the random prompts;
    - ``segment_mib``: pool memory per engine.
    """

    env_prefix: ClassVar[str] = BENCH_ENV
    lengths: list[int] = setting([512, 1024, 2048, 4096])
    modes: list[str] = setting(["after", "streaming"], choices=MODES)
    repeat: int = 3
    seed: int = 0
    segment_mib: int = 1024


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``bench overlap``: its prompts, the engine, and the pool's staging settings
    (``--kv-staging always`` measures what streaming hides through host staging)."""
    for cls in (OverlapBenchConfig, EngineConfig):
        add_config_args(parser, cls)
    add_config_args(parser, PoolConfig, only=STAGING_SETTINGS)


def _engines(
    config: EngineConfig, pool: PoolConfig, modes: list[str]
) -> dict[str, tuple[Engine, Engine]]:
    """A (prefill, decode) pair per mode; ``streaming`` and ``push`` share one."""
    out: dict[str, tuple[Engine, Engine]] = {}
    for mode in modes:
        streams = mode != "after"
        shared = next((pair for m, pair in out.items() if (m != "after") == streams), None)
        if shared is None:
            cfg = dataclasses.replace(config, kv_streaming=streams)
            shared = Engine(cfg, pool), Engine(cfg, pool)
            if shared[0].pool is None or shared[1].pool is None:
                raise RuntimeError("the engines could not join the pool")
        out[mode] = shared
    return out


def _row(mode: str, length: int, run: Handoff) -> dict[str, Any]:
    return {
        "mode": mode,
        "prompt_tokens": length,
        "prefill_s": run.prefill_seconds,
        "write_bytes": run.write.bytes,
        "write_s": run.write.seconds,
        "write_exposed_s": run.write.exposed_seconds,
        "read_bytes": run.read.bytes,
        "read_s": run.read.seconds,
        "adopt_s": run.adopt_seconds,
        "exposed_s": run.write.exposed_seconds + run.adopt_seconds,
        "pushed": run.push is not None and run.push.ok,
    }


def run(args: argparse.Namespace) -> int:
    config = config_from_args(EngineConfig, args)
    rng = random.Random(args.seed)
    rows: list[dict[str, Any]] = []
    modes = [m for m in MODES if m in args.modes]
    with scratch_pool(args.segment_mib) as (_, pool):
        staging = {k: getattr(args, k) for k in STAGING_SETTINGS}
        engines = _engines(config, dataclasses.replace(pool, **staging), modes)
        staged = all(
            e.pool is not None and e.pool.staged for pair in engines.values() for e in pair
        )
        model = engines[modes[0]][0].model_dir.name
        vocab = engines[modes[0]][0].model_config.vocab_size
        params = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
        try:
            for rep in range(args.repeat):
                for length in args.lengths:
                    for mode in modes if rep % 2 == 0 else modes[::-1]:
                        prompt = list(random_tokens(rng, length, vocab, low=0))
                        prefill, decode = engines[mode]
                        rid, push = f"{mode}-{rep}-{length}", mode == "push"
                        done = handoff(prefill, decode, rid, prompt, params, LEASE_S, push=push)
                        rows.append(_row(mode, length, done))
                        log(f"rep {rep} {mode:9s} {length:5d} tokens: {rows[-1]}")
        finally:
            for engine in {id(e): e for pair in engines.values() for e in pair}.values():
                engine.close()
    results, headline = _results(rows, args.lengths, modes)
    emit(
        "overlap",
        {
            "model": model,
            "prompt_tokens": args.lengths,
            "modes": modes,
            "block_tokens": config.block_tokens,
            "max_num_batched_tokens": config.max_num_batched_tokens,
            "dtype": config.dtype,
            "repeat": args.repeat,
            "seed": args.seed,
            "pool": "mooncake_master on loopback TCP, both engines in one process",
            "kv_staging": args.kv_staging,
            "staged": staged,
        },
        [*results, {"runs": rows}],
        headline,
    )
    return 0


def _results(
    rows: list[dict[str, Any]], lengths: list[int], modes: list[str]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The summary rows and the headline of the modes that ran (module docstring): per
    length, medians of the repetitions, and percentiles of the TTFT."""

    def of(mode: str, key: str, length: int) -> list[Any]:
        return [r[key] for r in rows if r["mode"] == mode and r["prompt_tokens"] == length]

    def med(mode: str, key: str, length: int) -> float:
        return median(of(mode, key, length))

    results: list[dict[str, Any]] = []
    headline: dict[str, Any] = {}
    if "push" in modes and "streaming" in modes:
        for n in lengths:
            pool, push = med("streaming", "exposed_s", n), med("push", "exposed_s", n)
            pushed = of("push", "pushed", n)
            results.append(
                {
                    "prompt_tokens": n,
                    "kv_mib": med("streaming", "write_bytes", n) / 2**20,
                    "exposed_pool_s": pool,
                    "exposed_push_s": push,
                    "exposed_pool_over_push": pool / push if push > 0 else 0.0,
                    "ttft_pool_p50_s": percentile(of("streaming", "prefill_s", n), 50),
                    "ttft_pool_p90_s": percentile(of("streaming", "prefill_s", n), 90),
                    "ttft_push_p50_s": percentile(of("push", "prefill_s", n), 50),
                    "ttft_push_p90_s": percentile(of("push", "prefill_s", n), 90),
                    "pushes_ok": sum(bool(r) for r in pushed),
                    "pushes": len(pushed),
                }
            )
        worst = min(r["exposed_pool_over_push"] for r in results)
        headline = {
            "metric": "exposed KV transfer, pool (streaming) / direct push (worst length)",
            "value": worst,
            "baseline": 1.0,
            "ratio": worst,
            "target": 1.0,
        }
    if "after" in modes and "streaming" in modes:
        hidden = []
        for n in lengths:
            transfer, exposed = med("after", "exposed_s", n), med("streaming", "exposed_s", n)
            after, streaming = med("after", "prefill_s", n), med("streaming", "prefill_s", n)
            hidden.append(
                {
                    "prompt_tokens": n,
                    "kv_mib": med("after", "write_bytes", n) / 2**20,
                    "transfer_after_s": transfer,
                    "exposed_streaming_s": exposed,
                    "hidden": 1 - exposed / transfer if transfer > 0 else 0.0,
                    "prefill_after_s": after,
                    "prefill_streaming_s": streaming,
                    "prefill_slowdown": streaming / after,
                }
            )
        results += hidden
        worst = min(r["hidden"] for r in hidden)
        headline = {
            "metric": "share of KV transfer hidden by layer-wise streaming (worst length)",
            "value": worst,
            "baseline": 0.0,
            "ratio": worst,
            "target": 0.9,
        }
    return results, headline

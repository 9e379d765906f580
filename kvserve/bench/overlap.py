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

``hidden = 1 - exposed(streaming) / transfer(after)``, from the medians; also the prefill
slowdown streaming causes (the transfer threads share the machine's cores with the compute;
run with ``--threads 1`` on 2 cores to leave one core to them, as a pinned worker pair
would). Conditions: model, lengths, block size, chunk budget, threads and repetitions.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
from typing import Any

import torch

from kvpool.config import STAGING_SETTINGS, PoolConfig
from kvserve.bench.handoff import Handoff, handoff, scratch_pool
from kvserve.report import emit, log, median
from workers.config import EngineConfig
from workers.engine import Engine
from workers.sequence import SamplingParams

MODES = ("after", "streaming")


def _engines(config: EngineConfig, pool: PoolConfig) -> dict[str, tuple[Engine, Engine]]:
    out: dict[str, tuple[Engine, Engine]] = {}
    for mode in MODES:
        cfg = dataclasses.replace(config, kv_streaming=mode == "streaming")
        prefill, decode = Engine(cfg, pool), Engine(cfg, pool)
        if prefill.pool is None or decode.pool is None:
            raise RuntimeError("the engines could not join the pool")
        out[mode] = (prefill, decode)
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
    }


def run_bench(args: argparse.Namespace, config: EngineConfig) -> None:
    rng = random.Random(args.seed)
    rows: list[dict[str, Any]] = []
    with scratch_pool(args.segment_mib) as (_, pool):
        staging = {k: getattr(args, k) for k in STAGING_SETTINGS}
        engines = _engines(config, dataclasses.replace(pool, **staging))
        staged = all(
            e.pool is not None and e.pool.staged for pair in engines.values() for e in pair
        )
        vocab = engines["after"][0].model_config.vocab_size
        params = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
        try:
            for rep in range(args.repeat):
                for length in args.lengths:
                    for mode in MODES if rep % 2 == 0 else MODES[::-1]:
                        prompt = [rng.randrange(vocab) for _ in range(length)]
                        prefill, decode = engines[mode]
                        run = handoff(prefill, decode, f"{mode}-{rep}-{length}", prompt, params)
                        rows.append(_row(mode, length, run))
                        log(f"rep {rep} {mode:9s} {length:5d} tokens: {rows[-1]}")
        finally:
            for pair in engines.values():
                for engine in pair:
                    engine.close()
    results = _summarise(rows, args.lengths)
    worst = min(r["hidden"] for r in results)
    emit(
        "overlap",
        {
            "model": engines["after"][0].model_dir.name,
            "prompt_tokens": args.lengths,
            "block_tokens": config.block_tokens,
            "max_num_batched_tokens": config.max_num_batched_tokens,
            "dtype": config.dtype,
            "threads": torch.get_num_threads(),
            "repeat": args.repeat,
            "seed": args.seed,
            "pool": "mooncake_master on loopback TCP, both engines in one process",
            "kv_staging": args.kv_staging,
            "staged": staged,
        },
        [*results, {"runs": rows}],
        {
            "metric": "share of KV transfer hidden by layer-wise streaming (worst length)",
            "value": worst,
            "baseline": 0.0,
            "ratio": worst,
            "target": 0.9,
        },
    )


def _summarise(rows: list[dict[str, Any]], lengths: list[int]) -> list[dict[str, Any]]:
    out = []
    for length in lengths:

        def med(mode: str, key: str, n: int = length) -> float:
            return median([r[key] for r in rows if r["mode"] == mode and r["prompt_tokens"] == n])

        transfer = med("after", "exposed_s")
        exposed = med("streaming", "exposed_s")
        out.append(
            {
                "prompt_tokens": length,
                "kv_mib": med("after", "write_bytes") / 2**20,
                "transfer_after_s": transfer,
                "exposed_streaming_s": exposed,
                "hidden": 1 - exposed / transfer if transfer > 0 else 0.0,
                "prefill_after_s": med("after", "prefill_s"),
                "prefill_streaming_s": med("streaming", "prefill_s"),
                "prefill_slowdown": med("streaming", "prefill_s") / med("after", "prefill_s"),
            }
        )
    return out

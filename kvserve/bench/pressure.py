"""``kvserve bench pressure``: the first-to-second-token gap of hand-offs through a pool too
small for its load, with the decode side's landing wait of this version against the old one.

Starts its own ``mooncake_master``; in this process a prefill engine and a decode engine,
each on its own :class:`~workers.engine.loop.EngineLoop` thread (as two workers' engine
threads), each a pool member contributing ``--segment-mib``: a few prompts' KV overflow it,
so layer puts fail while the master evicts, and some blocks of a prompt never land. Requests
of ``--prompt-len`` fresh tokens arrive every ``--interval`` seconds (open loop), each on its
own thread, doing what the router and the two servicers do:

1. ``reserve`` on the decode engine (its landing starts), retried while pages are not free;
2. the prefill (``handoff=True``); its first token is the TTFT;
3. the wait for the landing of ``Generate`` with ``first_token``, then ``adopt``; the decode
   engine's first output is the second token (``gap`` = its time after the first).

Modes, in alternating phases of ``--requests`` requests (new, old, old, new, ...):

- ``new``: :meth:`~kvpool.landing.Landing.settle` (until over, or no progress for
  ``--stall-s``, capped at ``--cap-s``), and a cancel keeps the verified leading blocks;
- ``old``: the wait before this change: until the landing is over, capped at ``--cap-s``,
  and a cancel keeps nothing (:class:`KeepNothingLander`, the old ``Lander.cancel``).
  A read that fails ends a landing early in both modes (that part is not switched off).
"""

from __future__ import annotations

import argparse
import math
import queue
import random
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from kvpool.landing import STALL_S, Lander, Landing
from kvpool.master import master_stats
from kvserve.bench.common import scratch_pool
from kvserve.cluster.deployment import SegmentConfig
from kvserve.loadgen.workloads import random_tokens
from kvserve.report import emit, log, median
from kvserve.settings import BENCH_ENV, add_config_args, config_from_args
from workers.config import EngineConfig

if TYPE_CHECKING:  # the engine's modules are imported by run(): `kvserve --help` stays fast
    from workers.core.outputs import RequestOutput
    from workers.engine.engine import Engine
    from workers.engine.loop import EngineLoop

MODES = ("new", "old")
OUTPUT_WAIT_S = 600.0
"""Give up on an engine output after this long (a stuck run, not a measurement)."""


class KeepNothingLander(Lander):
    """The ``Lander.cancel`` before this change: the landing ends without verifying the
    blocks it had read, so none of them is kept (benchmark baseline only)."""

    def cancel(self, landing: Landing, keep: bool = True) -> None:
        super().cancel(landing, keep=False)


@dataclass(frozen=True)
class PressureConfig:
    """The load of ``kvserve bench pressure``.

    - ``requests``: requests per phase;
    - ``phases``: phases, modes alternating;
    - ``prompt_len``: prompt tokens per request;
    - ``interval``: seconds between arrivals;
    - ``stall_s``: new mode's stall time;
    - ``cap_s``: hard cap, both modes (default: the servicer's);
    - ``seed``: seed of the prompts.
    """

    env_prefix: ClassVar[str] = BENCH_ENV
    requests: int = 8
    phases: int = 4
    prompt_len: int = 2048
    interval: float = 2.0
    stall_s: float = STALL_S
    cap_s: float | None = None
    seed: int = 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The load's flags, a small pool (96 MiB per engine) and the engine's."""
    add_config_args(p, PressureConfig)
    add_config_args(p, SegmentConfig, defaults={"segment_mib": 96})
    add_config_args(p, EngineConfig)


def _first_output(loop: EngineLoop, rid: str, add: Callable[[Engine], object]) -> RequestOutput:
    """Start request ``rid`` on ``loop`` (``add`` adds it); its first output."""
    outputs: queue.SimpleQueue[RequestOutput | None] = queue.SimpleQueue()
    loop.start_request(rid, outputs.put, add).result()
    out = outputs.get(timeout=OUTPUT_WAIT_S)
    if out is None or out.error is not None:
        raise RuntimeError(f"the engine failed a request: {out and out.error}")
    return out


def _request(
    pair: tuple[EngineLoop, EngineLoop], mode: str, rid: str, prompt: list[int], args: Any
) -> dict[str, Any]:
    """One hand-off, steps 1-3 of the module docstring: its times, whether its landing was
    over in time and the tokens it took from the pool."""
    from workers.core.sequence import SamplingParams

    prefill, decode = pair
    params = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
    t0 = time.perf_counter()
    while (seq := decode.call(lambda e: e.reserve(rid, prompt, 2, 120.0)).result()) is None:
        time.sleep(0.05)
    prefilled = _first_output(
        prefill, rid, lambda e: e.add_request(prompt, params, rid, handoff=True)
    )
    first, t_first = prefilled.new_token_ids[0], time.perf_counter()
    landing = decode.call(lambda e: e.reservations.landing(rid)).result()
    landed = True
    if landing is not None:
        decode.engine.reservations.nudge()
        landed = landing.settle(args.stall_s if mode == "new" else math.inf, args.cap_s)
    t_wait = time.perf_counter()
    _first_output(decode, rid, lambda e: e.adopt(rid, prompt, first, params))
    return {
        "mode": mode,
        "ttft_s": t_first - t0,
        "wait_s": t_wait - t_first,
        "gap_s": time.perf_counter() - t_first,
        "landed": landed,
        "pool_tokens": seq.num_pool_tokens,
    }


def _phase(
    pair: tuple[EngineLoop, EngineLoop], mode: str, phase: int, args: Any, rng: random.Random
) -> list[dict[str, Any]]:
    """A phase of ``mode``: its requests, one arriving every ``--interval`` seconds, each
    on a thread of its own; their rows, in the order they finished."""
    decode = pair[1]
    lander = decode.engine.reservations.lander
    assert lander is not None, "the decode engine needs kv_streaming (a landing)"
    keep_nothing = KeepNothingLander() if mode == "old" else None

    def swap(engine: Engine, to: Lander) -> None:
        assert not engine.reservations, "swap landers only between phases"
        engine.reservations.lander = to

    if keep_nothing is not None:
        decode.call(lambda e: swap(e, keep_nothing)).result()
    vocab = decode.engine.model_config.vocab_size
    rows: list[dict[str, Any]] = []
    try:
        with ThreadPoolExecutor(args.requests, thread_name_prefix=f"{mode}-{phase}") as threads:
            for i in range(args.requests):
                prompt = list(random_tokens(rng, args.prompt_len, vocab, low=0))
                sent = threads.submit(_request, pair, mode, f"{mode}-{phase}-{i}", prompt, args)
                sent.add_done_callback(lambda done: rows.append(done.result()))
                time.sleep(args.interval)
    finally:
        if keep_nothing is not None:
            decode.call(lambda e: swap(e, lander)).result()
            keep_nothing.close()
    if len(rows) != args.requests:
        raise RuntimeError("some requests failed (see the log)")
    return rows


def _summary(mode: str, rows: list[dict[str, Any]], prompt_len: int) -> dict[str, Any]:
    """Median and p99 (nearest rank: with fewer than 100 requests, the largest) of each
    time, and the landings' shortfall, of the requests of ``mode``."""
    mine = [r for r in rows if r["mode"] == mode]
    out: dict[str, Any] = {"mode": mode, "requests": len(mine)}
    for key in ("ttft", "wait", "gap"):
        values = sorted(r[f"{key}_s"] for r in mine)
        out[f"{key}_median_s"] = median(values)
        out[f"{key}_p99_s"] = values[max(0, math.ceil(0.99 * len(values)) - 1)]
    out["incomplete_landings"] = sum(r["pool_tokens"] < prompt_len for r in mine)
    out["stalled_or_capped"] = sum(not r["landed"] for r in mine)
    out["recomputed_tokens_mean"] = sum(prompt_len - r["pool_tokens"] for r in mine) / len(mine)
    return out


def run(args: argparse.Namespace) -> int:
    from workers.engine.engine import Engine
    from workers.engine.loop import EngineLoop
    from workers.handoff.arrival import LANDING_WAIT_S

    if args.cap_s is None:
        args.cap_s = LANDING_WAIT_S
    config = config_from_args(EngineConfig, args)
    if not config.kv_streaming:
        raise SystemExit("bench pressure measures landings: run with kv streaming on")
    rng = random.Random(args.seed)
    rows: list[dict[str, Any]] = []
    with scratch_pool(args.segment_mib) as (master, pool):
        engines = Engine(config, pool), Engine(config, pool)
        if any(e.pool is None for e in engines):
            raise RuntimeError("the engines could not join the pool")
        pair = EngineLoop(engines[0]).start(), EngineLoop(engines[1]).start()
        try:
            for phase in range(args.phases):
                mode = MODES[(phase + phase // 2) % 2]  # new, old, old, new, new, ...
                rows += _phase(pair, mode, phase, args, rng)
                log(f"phase {phase} ({mode}): {_summary(mode, rows, args.prompt_len)}")
            stats = master_stats(master)
        finally:
            for loop in pair:
                loop.stop()
            for engine in engines:
                engine.close()
    new, old = (_summary(mode, rows, args.prompt_len) for mode in MODES)
    ratio = old["gap_p99_s"] / new["gap_p99_s"] if new["gap_p99_s"] > 0 else 0.0
    emit(
        "pressure",
        {
            "model": engines[0].model_dir.name,
            "prompt_tokens": args.prompt_len,
            "requests_per_mode": args.requests * args.phases // 2,
            "interval_s": args.interval,
            "segment_mib_per_engine": args.segment_mib,
            "pool_capacity_mib": stats.capacity_bytes / 2**20,
            "evicted_keys": stats.evicted_keys,
            "stall_s": args.stall_s,
            "cap_s": args.cap_s,
            "block_tokens": config.block_tokens,
            "max_num_batched_tokens": config.max_num_batched_tokens,
            "seed": args.seed,
            "pool": "mooncake_master on loopback TCP, both engines in one process",
        },
        [new, old, {"runs": rows}],
        {
            "metric": "p99 gap between first and second token, old / new",
            "value": ratio,
            "old_gap_p99_s": old["gap_p99_s"],
            "new_gap_p99_s": new["gap_p99_s"],
        },
    )
    return 0

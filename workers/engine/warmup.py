"""Warm-up: one short request through a new engine before the worker registers.

The first forward of a process pays one-off costs: oneDNN packs every linear weight
(:class:`workers.model.llama.Linear`), kernels and thread pools start, allocator pools
grow. Without a warm-up the first request after a start paid them in its TTFT. The warm-up
request is shorter than one KV block, so it leaves nothing in the prefix cache and publishes
nothing to the pool (except with one-token pages, where any token fills a block: then its
two blocks are cached like any request's); the engine's stats are reset afterwards, so
measured speeds (load reports) start from real requests only.
"""

from __future__ import annotations

import logging
import time

from workers.core.outputs import EngineStats
from workers.core.sequence import SamplingParams
from workers.engine.engine import Engine

log = logging.getLogger(__name__)

WARMUP_TOKENS = 8
"""Prompt length of the warm-up request (capped below one block)."""


def warm_up(engine: Engine) -> float:
    """Run a prefill step and a decode step of one throwaway request on ``engine`` (which
    must be idle); returns the seconds it took."""
    started = time.perf_counter()
    length = max(1, min(WARMUP_TOKENS, engine.config.block_tokens - 1))
    prompt = [i % engine.model_config.vocab_size for i in range(1, length + 1)]
    engine.generate([prompt], SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))
    engine.stats = EngineStats()
    seconds = time.perf_counter() - started
    log.info("warm-up: %.2f s", seconds)
    return seconds

"""The worker's warm-up request leaves the engine as a fresh one: no pages, no cache, no stats."""

from __future__ import annotations

from pathlib import Path

from workers.config import EngineConfig
from workers.core.outputs import EngineStats
from workers.core.sequence import SamplingParams
from workers.engine.engine import Engine
from workers.engine.warmup import WARMUP_TOKENS, warm_up


def test_warm_up_leaves_no_trace(tiny_model_dir: Path) -> None:
    config = EngineConfig(model=str(tiny_model_dir), block_tokens=16, kv_cache_mib=16)
    engine = Engine(config)
    try:
        pool = engine.scheduler.blocks.pool
        assert config.block_tokens > WARMUP_TOKENS
        warm_up(engine)
        assert engine.stats == EngineStats()
        assert not engine.has_unfinished
        assert pool.num_free == pool.num_blocks
        assert all(h is None for h in pool.block_hash)  # nothing entered the prefix cache
        # the engine serves as before, and counts only the real request
        prompt = list(range(3, 40))
        [out] = engine.generate([prompt], SamplingParams(max_tokens=3, temperature=0))
        assert len(out.output_token_ids) == 3
        assert engine.stats.prompt_tokens_computed == len(prompt)
    finally:
        engine.close()

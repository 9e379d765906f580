"""Run as a separate process: an engine that computes a prompt and publishes it to the pool.

``python -m tests.integration.engine_writer MODEL_DIR MASTER METADATA PROMPT_JSON``

Prints one JSON line: the greedy output and, for every full prompt block, its hash and the
xxh3 digest of each layer's KV span as this engine computed it. Then waits for a line on
stdin before leaving the pool (its memory segment holds the objects it wrote).
"""

from __future__ import annotations

import json
import sys

from kvpool.config import PoolConfig
from tests.staging import STAGING
from workers.config import EngineConfig
from workers.core.sequence import SamplingParams
from workers.engine.engine import Engine


def page_digests(engine: Engine, prompt: list[int]) -> list[tuple[int, list[str]]]:
    """(hash, per-layer digests) of the cached full blocks of ``prompt`` in ``engine``."""
    import xxhash

    bt = engine.config.block_tokens
    out = []
    for h in engine.hasher.chain(prompt, bt):
        page = engine.scheduler.blocks.pool.lookup(h)
        assert page is not None, "block not in the local cache"
        slab = engine.runner.kv.slab
        out.append(
            (
                h,
                [
                    xxhash.xxh3_64_hexdigest(slab[layer, page].numpy().tobytes())
                    for layer in range(slab.shape[0])
                ],
            )
        )
    return out


def main() -> None:
    model, master, metadata, prompt_json = sys.argv[1:5]
    prompt = json.loads(prompt_json)
    config = EngineConfig(model=model, block_tokens=16, kv_cache_mib=32)
    pool = PoolConfig(
        pool_master=master,
        pool_metadata_server=metadata,
        pool_segment_mib=64,
        pool_local_buffer_mib=16,
        kv_staging=STAGING,
    )
    engine = Engine(config, pool)
    assert engine.pool is not None
    (out,) = engine.generate([prompt], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    print(
        json.dumps(
            {
                "tokens": out.output_token_ids,
                "blocks": page_digests(engine, prompt[: len(prompt) - 1]),
            }
        ),
        flush=True,
    )
    sys.stdin.readline()
    engine.close()


if __name__ == "__main__":
    main()

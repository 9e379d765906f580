"""Two engines sharing one pool: a prefix computed by one is reused by the other."""

from __future__ import annotations

import functools
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvpool.budget import PoolBudget
from kvpool.chain_index import ChainIndex
from kvpool.config import PoolConfig
from kvpool.master import MasterConfig, master_stats
from kvpool.net import free_local_ports
from tests.integration.pool_fixtures import pool_config, running_master, running_redis
from tests.integration.reference import hf_greedy
from tests.staging import STAGING
from workers.config import EngineConfig
from workers.core.sequence import SamplingParams
from workers.engine.engine import Engine

pytestmark = pytest.mark.kv_path

GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


@pytest.fixture
def master(tmp_path: Path) -> Iterator[MasterConfig]:
    with running_master(tmp_path) as cfg:
        yield cfg


def pooled_engine(model_dir: Path, master: MasterConfig, index: ChainIndex | None = None) -> Engine:
    config = EngineConfig(
        model=str(model_dir), block_tokens=16, kv_cache_mib=32, max_num_batched_tokens=64
    )
    engine = Engine(config, pool_config(master), None, index)
    assert engine.pool is not None
    assert engine.pool.staged is (STAGING == "always")  # the mode this run tests
    return engine


def test_engine_b_reuses_the_prefix_engine_a_computed(
    tiny_model_dir: Path, master: MasterConfig
) -> None:
    rng = random.Random(21)
    shared = [rng.randrange(49152) for _ in range(100)]
    prompt_a = [*shared, 1, 2, 3]
    prompt_b = [*shared, 7, 8, 9, 10, 11]
    a = pooled_engine(tiny_model_dir, master)
    b = pooled_engine(tiny_model_dir, master)
    try:
        (out_a,) = a.generate([prompt_a], GREEDY)
        assert out_a.num_pool_tokens == 0
        assert a.pool is not None and a.pool.stats.blocks_written >= 6
        (out_b,) = b.generate([prompt_b], GREEDY)
        # Six full 16-token blocks of the shared 100 tokens came from the pool ...
        assert out_b.num_pool_tokens == 96 and out_b.num_cached_tokens == 96
        # ... so B computed only the rest of its prompt ...
        assert b.stats.prompt_tokens_computed == len(prompt_b) - 96
        assert b.stats.prompt_tokens_from_pool == 96
        # ... and its tokens are those of the reference model.
        assert out_b.output_token_ids == hf_greedy(tiny_model_dir, prompt_b, GREEDY.max_tokens)
    finally:
        a.close()
        b.close()


def test_engine_runs_without_a_reachable_pool(tiny_model_dir: Path) -> None:
    from kvpool.config import PoolConfig

    (port,) = free_local_ports(1)
    config = EngineConfig(model=str(tiny_model_dir), block_tokens=16, kv_cache_mib=32)
    engine = Engine(
        config,
        PoolConfig(
            pool_master=f"127.0.0.1:{port}", pool_metadata_server=f"http://127.0.0.1:{port}/m"
        ),
    )
    assert engine.pool is None
    (out,) = engine.generate([[5, 6, 7]], GREEDY)
    assert len(out.output_token_ids) == GREEDY.max_tokens


def test_kv_crosses_engines_in_separate_processes_bit_exact(
    tiny_model_dir: Path, master: MasterConfig
) -> None:
    import json
    import subprocess
    import sys

    from tests.integration.engine_writer import page_digests

    rng = random.Random(22)
    prompt = [rng.randrange(49152) for _ in range(70)]
    writer = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.integration.engine_writer",
            str(tiny_model_dir),
            master.rpc_address,
            master.metadata_url,
            json.dumps(prompt),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    b = pooled_engine(tiny_model_dir, master)
    try:
        assert writer.stdout is not None
        line = writer.stdout.readline()
        assert line, "the writer process died"
        report = json.loads(line)
        (out,) = b.generate([prompt], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
        assert out.num_pool_tokens == 64  # four 16-token blocks of the 69 before the last
        assert out.output_token_ids == report["tokens"]
        mine = page_digests(b, prompt[: len(prompt) - 1])
        assert [[h, d] for h, d in mine] == report["blocks"]  # every layer, bit for bit
    finally:
        b.close()
        if writer.stdin:
            writer.stdin.close()
        writer.wait(60)


@pytest.fixture
def index(tmp_path: Path) -> Iterator[ChainIndex]:
    with running_redis(tmp_path) as client:
        yield ChainIndex(client, "engines:pool")


def test_engines_evicting_chain_aware_stay_exact(
    tiny_model_dir: Path, master: MasterConfig, index: ChainIndex
) -> None:
    rng = random.Random(23)
    shared = [rng.randrange(49152) for _ in range(48)]  # three blocks every prompt shares
    prompts = [[*shared, *(rng.randrange(49152) for _ in range(50))] for _ in range(4)]
    a = pooled_engine(tiny_model_dir, master, index)
    b = pooled_engine(tiny_model_dir, master)
    try:
        # as a worker joins: the budget is pool_evict_at of the capacity the master reports
        assert a.pool is not None and a.pool.evictor is not None
        budget = a.pool.evictor.budget
        assert isinstance(budget, PoolBudget) and budget.url == master.metrics_url
        budget.refresh()
        capacity = master_stats(master).capacity_bytes
        assert capacity > 0 and budget() == int(capacity * PoolConfig().pool_evict_at)
        a.pool.evictor.close()
        for engine in (a, b):  # then a budget of 8 blocks in all, for both
            assert engine.pool is not None
            engine.pool.evict_through(index, functools.partial(int, 8 * engine.pool.block_bytes))
        for prompt in prompts:  # 6 full blocks each: every prompt evicts older tails
            a.generate([prompt], GREEDY)
        assert a.pool is not None and a.pool.evictor is not None
        assert a.pool.evictor.stats.evicted_blocks > 0
        indexed = index.blocks()
        for block in indexed:  # no block without its parent
            parent = index.parent_of(block)
            assert parent == "" or parent in indexed
        assert len(indexed) <= 8 + 6
        keys = a.pool.keys
        prefix = [keys.meta_key(h) for h in a.hasher.chain(shared, 16)]
        assert set(prefix) <= set(indexed)  # every chain extends it: never a leaf
        assert a.pool.lookup(a.hasher.chain(prompts[0], 16)) == 3  # its own tail went first
        (out,) = b.generate([prompts[-1]], GREEDY)  # the newest chain is whole in the pool
        assert out.num_pool_tokens == 96
        assert out.output_token_ids == hf_greedy(tiny_model_dir, prompts[-1], GREEDY.max_tokens)
        (out,) = b.generate([prompts[0]], GREEDY)  # its tail was evicted, the prefix kept
        assert (out.num_cached_tokens, out.num_pool_tokens) == (48, 0)  # the prefix is local
        assert out.output_token_ids == hf_greedy(tiny_model_dir, prompts[0], GREEDY.max_tokens)
    finally:
        a.close()
        b.close()

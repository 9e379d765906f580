"""Greedy tokens equal transformers' while batching, chunking, caching and preempting."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from tests.integration.reference import hf_greedy, hf_last_logits
from tests.native_kernels import require_native
from workers.config import EngineConfig
from workers.core.outputs import RequestOutput
from workers.core.sequence import SamplingParams
from workers.engine.engine import Engine
from workers.model.prepare import make_tiny_model

GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
LENGTHS = (1, 7, 16, 33, 64, 130, 257, 600, 95, 17)
LOGIT_ATOL = 1e-3  # fp32, different kernels and summation orders


def random_prompts(lengths: tuple[int, ...], seed: int, vocab: int = 49152) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(n)] for n in lengths]


def run_staggered(
    engine: Engine, prompts: list[list[int]], params: SamplingParams, every: int = 2
) -> tuple[list[RequestOutput], dict[str, torch.Tensor]]:
    """Add prompt i at step ``i * every``; returns final outputs and first-token logits."""
    ids: list[str] = []
    done: dict[str, RequestOutput] = {}
    first_logits: dict[str, torch.Tensor] = {}
    step = 0
    while len(done) < len(prompts):
        while len(ids) < len(prompts) and len(ids) * every <= step:
            ids.append(engine.add_request(prompts[len(ids)], params))
        outs = engine.step()
        logits = engine.runner.last_logits
        for row, out in enumerate(outs):
            if len(out.output_token_ids) == 1 and logits is not None:
                first_logits[out.request_id] = logits[row].clone()
            if out.finished:
                done[out.request_id] = out
        step += 1
    return [done[i] for i in ids], first_logits


DEFAULTS: dict[str, object] = {
    "block_tokens": 16,
    "kv_cache_mib": 64,
    "max_num_batched_tokens": 96,
}


@pytest.fixture(autouse=True, params=["native", "torch"])
def attention(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test here runs on the C++ attention kernels and again on the torch path."""
    if request.param == "native":
        require_native()
    monkeypatch.setitem(DEFAULTS, "attention", request.param)
    return str(request.param)


def make_engine(model_dir: Path, **overrides: object) -> Engine:
    settings: dict[str, object] = {"model": str(model_dir), **DEFAULTS}
    settings.update(overrides)
    return Engine(EngineConfig(**settings))  # type: ignore[arg-type]


def assert_matches_reference(
    model_dir: Path, engine: Engine, prompts: list[list[int]], max_tokens: int = 12
) -> None:
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    outs, logits = run_staggered(engine, prompts, params)
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.output_token_ids == hf_greedy(model_dir, prompt, max_tokens), len(prompt)
        ref = hf_last_logits(model_dir, prompt)
        torch.testing.assert_close(logits[out.request_id], ref, atol=LOGIT_ATOL, rtol=0)
    assert engine.num_free_blocks == engine.scheduler.config.num_blocks


def test_tiny_llama_staggered_batching_and_chunked_prefill(tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir)
    assert_matches_reference(tiny_model_dir, engine, random_prompts(LENGTHS, seed=1))
    # The 600-token prompt needed several chunks of at most 96 tokens while others decoded.
    assert engine.stats.steps > 600 // 96


def test_prefix_cache_hit_gives_identical_tokens(tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir)
    rng = random.Random(7)
    shared = [rng.randrange(49152) for _ in range(80)]
    first = [*shared, 11, 12, 13]
    second = [*shared, 21, 22, 23, 24, 25]
    (out1,) = engine.generate([first], GREEDY)
    assert out1.num_cached_tokens == 0
    (out2,) = engine.generate([second], GREEDY)
    assert out2.num_cached_tokens == 80  # five full 16-token blocks came from the cache
    assert out2.output_token_ids == hf_greedy(tiny_model_dir, second, GREEDY.max_tokens)
    (again,) = engine.generate([first], GREEDY)
    assert again.num_cached_tokens == 80
    assert again.output_token_ids == out1.output_token_ids


def test_preemption_by_recompute_keeps_tokens_exact(tiny_model_dir: Path) -> None:
    # 12 pages of 16 tokens: four ~40-token prompts growing by 12 tokens cannot all fit.
    engine = make_engine(tiny_model_dir, num_kv_blocks=12, max_num_batched_tokens=256)
    prompts = random_prompts((40, 41, 42, 43), seed=3)
    outs, _ = run_staggered(engine, prompts, GREEDY, every=0)
    assert engine.scheduler.num_preemptions > 0
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.output_token_ids == hf_greedy(tiny_model_dir, prompt, GREEDY.max_tokens)
    assert engine.num_free_blocks == 12


def test_abort_anywhere_frees_every_page(tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir)
    total = engine.scheduler.config.num_blocks
    prompts = random_prompts((300, 20, 5), seed=4)
    ids = [engine.add_request(p, GREEDY) for p in prompts]
    engine.step()  # first request mid-prefill, the others waiting or started
    assert engine.abort(ids[0])
    engine.step()
    engine.step()
    assert engine.abort(ids[1])
    assert engine.abort(ids[2])
    assert not engine.abort(ids[2])
    assert not engine.has_unfinished
    assert engine.num_free_blocks == total


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_qwen_switches_match_transformers(
    arch: str, tmp_path: Path, default_model_dir: Path
) -> None:
    model_dir = make_tiny_model(
        tmp_path / arch, seed=2, arch=arch, layers=2, tokenizer_dir=default_model_dir
    )
    engine = make_engine(model_dir)
    assert_matches_reference(model_dir, engine, random_prompts((3, 40, 150), seed=5))


@pytest.mark.slow
def test_smollm2_matches_transformers(default_model_dir: Path) -> None:
    engine = make_engine(
        default_model_dir, block_tokens=64, kv_cache_mib=256, max_num_batched_tokens=128
    )
    tok = engine.tokenizer
    prompts = [
        tok.encode_chat([{"role": "user", "content": "What is the capital of France?"}]),
        tok.encode("The quick brown fox jumps over the lazy dog. " * 12),
        tok.encode("def fibonacci(n):"),
    ]
    assert_matches_reference(default_model_dir, engine, prompts, max_tokens=8)

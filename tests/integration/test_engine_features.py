"""Engine features beyond greedy exactness: checkpoints, dtypes, stops, seeds, errors."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from tests.integration.reference import hf_last_logits, hf_model
from tests.integration.test_exactness import make_engine, random_prompts
from workers.engine import Engine
from workers.model.prepare import TOKENIZER_FILES
from workers.sequence import FinishReason, SamplingParams

GREEDY = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)


def test_sharded_checkpoint_loads_the_same_model(tiny_model_dir: Path, tmp_path: Path) -> None:
    sharded = tmp_path / "sharded"
    hf_model(tiny_model_dir).save_pretrained(sharded, max_shard_size="5MB")
    for name in TOKENIZER_FILES:
        if (tiny_model_dir / name).is_file():
            shutil.copy(tiny_model_dir / name, sharded / name)
    assert (sharded / "model.safetensors.index.json").is_file()
    prompts = random_prompts((9, 30), seed=11)
    a = make_engine(tiny_model_dir).generate(prompts, GREEDY)
    b = make_engine(sharded).generate(prompts, GREEDY)
    assert [o.output_token_ids for o in a] == [o.output_token_ids for o in b]


def test_bfloat16_engine_tracks_fp32_reference(tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir, dtype="bfloat16")
    assert engine.runner.kv.slab.dtype == torch.bfloat16
    (prompt,) = random_prompts((40,), seed=12)
    engine.add_request(prompt, GREEDY)
    engine.step()
    assert engine.runner.last_logits is not None
    ours = engine.runner.last_logits[0]
    ref = hf_last_logits(tiny_model_dir, prompt)
    assert torch.nn.functional.cosine_similarity(ours, ref, dim=0) > 0.99


def greedy_text(engine: Engine, prompt: list[int], n: int) -> tuple[list[int], str]:
    (out,) = engine.generate([prompt], SamplingParams(max_tokens=n, temperature=0, ignore_eos=True))
    assert out.text is not None
    return out.output_token_ids, out.text


def test_stop_token_ids_and_stop_strings(tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir)
    (prompt,) = random_prompts((12,), seed=13)
    tokens, text = greedy_text(engine, prompt, 12)
    (by_token,) = engine.generate(
        [prompt], SamplingParams(max_tokens=12, temperature=0, stop_token_ids=(tokens[4],))
    )
    assert by_token.output_token_ids == tokens[: tokens.index(tokens[4]) + 1]
    assert by_token.finish_reason is FinishReason.STOP
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    assert stop.strip()
    (by_string,) = engine.generate(
        [prompt], SamplingParams(max_tokens=12, temperature=0, stop=(stop,))
    )
    assert by_string.finish_reason is FinishReason.STOP
    assert by_string.text == text[: text.index(stop)]
    (capped,) = engine.generate([prompt], SamplingParams(max_tokens=3, temperature=0))
    assert capped.finish_reason is FinishReason.LENGTH and len(capped.output_token_ids) == 3


def test_eos_ends_a_request(tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir)
    (prompt,) = random_prompts((12,), seed=13)
    tokens, _ = greedy_text(engine, prompt, 6)
    engine.book.eos_token_ids = frozenset({tokens[2]})
    (out,) = engine.generate([prompt], SamplingParams(max_tokens=6, temperature=0))
    assert out.output_token_ids == tokens[: tokens.index(tokens[2]) + 1]
    assert out.finish_reason is FinishReason.STOP


def test_seeded_sampling_is_reproducible_in_any_batch(tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir)
    prompts = random_prompts((20, 33, 7), seed=14)
    seeded = SamplingParams(max_tokens=8, temperature=0.9, top_p=0.9, top_k=50, seed=1234)
    (alone,) = engine.generate([prompts[0]], seeded)
    noisy = SamplingParams(max_tokens=8, temperature=1.0)
    together = engine.generate(prompts, [seeded, noisy, noisy])
    assert together[0].output_token_ids == alone.output_token_ids
    (other_seed,) = engine.generate(
        [prompts[0]], SamplingParams(max_tokens=8, temperature=0.9, top_p=0.9, top_k=50, seed=99)
    )
    assert other_seed.output_token_ids != alone.output_token_ids


def test_invalid_requests_are_refused_before_any_allocation(tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir, max_model_len=64)
    free = engine.num_free_blocks
    with pytest.raises(ValueError, match="model length"):
        engine.add_request(list(range(60)), SamplingParams(max_tokens=10))
    with pytest.raises(ValueError, match="token ids"):
        engine.add_request([10**9], GREEDY)
    with pytest.raises(ValueError, match="at least one"):
        engine.add_request([], GREEDY)
    rid = engine.add_request([1, 2, 3], GREEDY)
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request([1, 2, 3], GREEDY, request_id=rid)
    assert engine.abort(rid)
    assert engine.num_free_blocks == free and not engine.has_unfinished


def drain(engine: Engine) -> list[int]:
    """Step until nothing is left; the tokens produced meanwhile."""
    tokens: list[int] = []
    while engine.has_unfinished:
        for out in engine.step():
            tokens += out.new_token_ids
    return tokens


def test_a_request_supersedes_its_own_stale_reservation(tiny_model_dir: Path) -> None:
    """A reservation held under a request's id gives way when the same request arrives
    to be resumed (its decode worker failed elsewhere) or prefilled here (its prefill
    worker failed): the output is the same as an uninterrupted run's, nothing is held."""
    engine = make_engine(tiny_model_dir)
    prompt = random_prompts((37,), seed=5)[0]
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    (whole,) = engine.generate([prompt], params)
    assert engine.reserve("r1", prompt, 12, lease_s=60.0) is not None
    engine.resume("r1", prompt, whole.output_token_ids[:5], params)
    assert len(engine.reservations) == 0
    assert whole.output_token_ids[:5] + drain(engine) == whole.output_token_ids
    assert engine.reserve("r2", prompt, 12, lease_s=60.0) is not None
    engine.add_request(prompt, params, "r2")
    assert len(engine.reservations) == 0
    assert drain(engine) == whole.output_token_ids
    assert engine.num_free_blocks == engine.num_blocks

"""Engine features beyond greedy exactness: checkpoints, dtypes, stops, seeds, errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from tests.integration.reference import hf_last_logits, hf_model
from tests.integration.test_exactness import make_engine, random_prompts
from workers.core.sequence import FinishReason, SamplingParams
from workers.engine.engine import Engine
from workers.model.loader import load_model
from workers.model.prepare import TOKENIZER_FILES

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


def test_tied_checkpoint_shares_the_head_in_any_dtype(tiny_model_dir: Path, tmp_path: Path) -> None:
    """With ``tie_word_embeddings`` the loaded head is the embedding's Parameter (the loader
    allocates the modules anew on the device), in the asked dtype."""
    tied = tmp_path / "tied"
    shutil.copytree(tiny_model_dir, tied)
    config = json.loads((tied / "config.json").read_text())
    (tied / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    model, cfg = load_model(tied, torch.float16, torch.device("cpu"))
    assert cfg.tie_word_embeddings and model.lm_head.weight is model.embed_tokens.weight
    assert model.lm_head.weight.dtype == torch.float16
    expected = hf_model(tiny_model_dir).model.embed_tokens.weight.half()
    assert torch.equal(model.embed_tokens.weight, expected)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_low_precision_engine_tracks_fp32_reference(tiny_model_dir: Path, dtype: str) -> None:
    """Weights, KV cache and RoPE tables in ``dtype``; logits in fp32, close to the fp32
    reference's after the prefill and after a decode step."""
    engine = make_engine(tiny_model_dir, dtype=dtype)
    runner = engine.runner
    want = getattr(torch, dtype)
    assert runner.kv.slab.dtype == runner.rope.cos.dtype == want
    assert {p.dtype for p in runner.model.parameters()} == {want}
    (prompt,) = random_prompts((40,), seed=12)
    request = engine.add_request(prompt, GREEDY)
    history = list(prompt)
    for _ in range(2):  # the prefill, then a decode
        (out,) = engine.step()
        assert runner.last_logits is not None and runner.last_logits.dtype == torch.float32
        ref = hf_last_logits(tiny_model_dir, history)
        assert torch.nn.functional.cosine_similarity(runner.last_logits[0], ref, dim=0) > 0.99
        assert out.request_id == request
        history.append(out.output_token_ids[-1])


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

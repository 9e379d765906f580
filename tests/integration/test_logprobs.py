"""Logprobs of sampled and prompt tokens equal transformers' log-softmax of the same logits,
whatever the chunking, batching and prefix cache (workers/core/logprobs.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.integration.reference import hf_logprobs
from tests.integration.test_exactness import random_prompts
from workers.config import EngineConfig
from workers.core.outputs import RequestOutput
from workers.core.sequence import SamplingParams, TokenLogprob
from workers.engine.engine import Engine

ATOL = 1e-4
"""fp32, our kernels against transformers' (the lm-eval comparison's tolerance)."""


def check(ours: list[TokenLogprob], ref: torch.Tensor, targets: list[int], k: int) -> None:
    """``ours[i]`` is the logprob of ``targets[i]`` at row ``i`` of ``ref`` (within
    :data:`ATOL`), with ``k`` alternatives whose values are ``ref``'s top ``k`` and whose ids
    have those values in ``ref`` (so two near-equal alternatives may trade places)."""
    assert len(ours) == len(targets) == ref.shape[0]
    want = ref.gather(1, torch.tensor(targets).unsqueeze(1)).squeeze(1)
    got = torch.tensor([lp.logprob for lp in ours])
    assert torch.allclose(got, want, atol=ATOL, rtol=0), (got - want).abs().max()
    values = ref.topk(k, dim=-1).values
    for row, lp in enumerate(ours):
        assert len(lp.top_ids) == len(set(lp.top_ids)) == k
        top = torch.tensor(lp.top_logprobs)
        assert torch.allclose(top, values[row], atol=ATOL, rtol=0)
        assert torch.allclose(ref[row, list(lp.top_ids)], top, atol=ATOL, rtol=0)


def run(engine: Engine, prompts: list[list[int]], params: SamplingParams) -> list[RequestOutput]:
    """Every request's outputs (all of them, in order), added together."""
    ids = [engine.add_request(p, params) for p in prompts]
    outs: dict[str, list[RequestOutput]] = {i: [] for i in ids}
    while engine.has_unfinished:
        for out in engine.step():
            outs[out.request_id].append(out)
    return [o for i in ids for o in outs[i]]


@pytest.fixture
def engine(tiny_model_dir: Path) -> Engine:
    config = EngineConfig(
        model=str(tiny_model_dir), block_tokens=16, kv_cache_mib=64, max_num_batched_tokens=96
    )
    return Engine(config)


def test_sampled_tokens_carry_their_raw_logprobs(engine: Engine, tiny_model_dir: Path) -> None:
    prompts = random_prompts((5, 40, 130), seed=3)
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logprobs=3)
    outs = run(engine, prompts, params)
    for prompt in prompts:
        mine = [o for o in outs if o.prompt_token_ids == prompt]
        assert all(len(o.logprobs) == len(o.new_token_ids) == 1 for o in mine)
        assert all(o.prompt_logprobs is None for o in mine)
        output = [t for o in mine for t in o.new_token_ids]
        ref = hf_logprobs(tiny_model_dir, prompt + output[:-1])[len(prompt) - 1 :]
        check([o.logprobs[0] for o in mine], ref, output, 3)


def test_prompt_logprobs_whole_prompt_through_chunks_and_cache(
    engine: Engine, tiny_model_dir: Path
) -> None:
    prompt = random_prompts((257,), seed=5)[0]
    plain = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    run(engine, [prompt], plain)  # now the prompt's blocks are cached
    params = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True, prompt_logprobs=2)
    first, second = run(engine, [prompt], params)
    assert first.num_cached_tokens == 0  # computed whole, though cached
    assert first.prompt_logprobs is not None and second.prompt_logprobs is None
    assert first.logprobs == [] and second.logprobs == []
    ref = hf_logprobs(tiny_model_dir, prompt)[:-1]
    check(first.prompt_logprobs, ref, prompt[1:], 2)


def test_zero_alternatives_and_a_one_token_prompt(engine: Engine) -> None:
    params = SamplingParams(
        max_tokens=1, temperature=0, ignore_eos=True, logprobs=0, prompt_logprobs=0
    )
    (out,) = run(engine, [[42]], params)
    assert out.prompt_logprobs == []  # the first token has none
    (lp,) = out.logprobs
    assert lp.top_ids == () and lp.logprob <= 0
    with pytest.raises(ValueError, match="logprobs must be in"):
        SamplingParams(logprobs=21)

"""A failure the engine hits on one request fails that request alone (issue 16).

The faults are injected where real ones would come from: the sampler (a row whose
probabilities are broken) and the model's forward pass (a token that breaks it). Each test
runs the same batch with and without the fault and checks that the innocent requests get
exactly their tokens, that the guilty one ends with an error, and that every page is back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.integration.reference import hf_greedy
from tests.integration.test_exactness import make_engine, random_prompts
from workers.core.sampling import sample as real_sample
from workers.core.sequence import FinishReason, SamplingParams
from workers.engine.engine import Engine

POISON_SEED = 4242
POISON_TOKEN = 31337


def assert_idle(engine: Engine) -> None:
    assert not engine.has_unfinished
    assert engine.num_free_blocks == engine.num_blocks
    assert engine._requests == {} and engine.runner._generators == {}


def sampled(seed: int) -> SamplingParams:
    return SamplingParams(max_tokens=10, temperature=0.8, seed=seed, ignore_eos=True)


GREEDY = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)


def test_a_sampling_failure_fails_its_request_alone(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompts = random_prompts((12, 30, 20, 9), seed=5)
    clean_params = [GREEDY, sampled(7), sampled(POISON_SEED + 1), GREEDY]
    engine = make_engine(tiny_model_dir)
    clean = engine.generate(prompts, clean_params)
    assert_idle(engine)

    def poisoned(logits: torch.Tensor, params: Any, generators: Any) -> list[int]:
        if any(p.seed == POISON_SEED for p in params):
            raise RuntimeError("probability tensor contains nan")
        return real_sample(logits, params, generators)

    monkeypatch.setattr("workers.engine.model_runner.sample", poisoned)
    params = [GREEDY, sampled(7), sampled(POISON_SEED), GREEDY]
    outs = engine.generate(prompts, params)
    for i in (0, 1, 3):
        assert outs[i].error is None
        assert outs[i].output_token_ids == clean[i].output_token_ids
        assert outs[i].finish_reason is FinishReason.LENGTH
    guilty = outs[2]
    assert guilty.finished and guilty.finish_reason is FinishReason.ABORT
    assert guilty.error == "RuntimeError: probability tensor contains nan"
    assert guilty.output_token_ids == []
    assert_idle(engine)
    monkeypatch.setattr("workers.engine.model_runner.sample", real_sample)
    assert engine.generate(prompts[:1], [GREEDY])[0].output_token_ids == clean[0].output_token_ids


def test_a_model_failure_is_blamed_on_its_request_and_the_rest_go_on(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompts = random_prompts((12, 30, 9), seed=6)
    poison = [*random_prompts((7,), seed=8)[0], POISON_TOKEN, 5]
    engine = make_engine(tiny_model_dir)
    model = engine.runner.model
    real_forward = model.forward

    def forward(input_ids: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if bool((input_ids == POISON_TOKEN).any()):
            raise IndexError("index out of range in self")
        return real_forward(input_ids, *args, **kwargs)

    monkeypatch.setattr(model, "forward", forward)
    # The poisoned prompt is admitted with the others: the first step fails as a whole.
    outs = engine.generate([prompts[0], poison, *prompts[1:]], [GREEDY] * 4)
    guilty = outs[1]
    assert guilty.finish_reason is FinishReason.ABORT
    assert guilty.error == "IndexError: index out of range in self"
    for prompt, out in zip(prompts, [outs[0], *outs[2:]], strict=True):
        assert out.error is None
        assert out.output_token_ids == hf_greedy(tiny_model_dir, prompt, 10)
    assert_idle(engine)

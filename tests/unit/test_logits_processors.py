"""Each logits processor against its reference (transformers' processors, OpenAI's formula),
and batches of mixed rows against the same rows one at a time."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch
from transformers import (
    MinNewTokensLengthLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
)

from workers.core.logits_processors import process
from workers.core.sequence import SamplingParams

VOCAB = 64
EOS = frozenset({2, 7})


@dataclass
class Row:
    """A request's history as the sampler sees it (``token_ids``: prompt, then output)."""

    params: SamplingParams
    token_ids: list[int]
    num_prompt_tokens: int


def logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 4


def history(seed: int, prompt: int = 12, output: int = 9) -> tuple[list[int], int]:
    """Prompt and output ids with repeats (drawn from a third of the vocabulary)."""
    rng = random.Random(seed)
    return [rng.randrange(VOCAB // 3) for _ in range(prompt + output)], prompt


def row(seed: int, **params: object) -> Row:
    ids, prompt = history(seed)
    return Row(SamplingParams(max_tokens=32, **params), ids, prompt)  # type: ignore[arg-type]


@pytest.mark.parametrize("penalty", [0.5, 1.3, 2.0, 100.0])
def test_repetition_penalty_is_transformers(penalty: float) -> None:
    """Prompt and output tokens alike, positive logits divided, negative multiplied."""
    r = row(1, repetition_penalty=penalty)
    x = logits(1)
    ref = RepetitionPenaltyLogitsProcessor(penalty)(torch.tensor([r.token_ids]), x.clone())
    assert torch.equal(process(x, [r], EOS), ref)


@pytest.mark.parametrize("ignore_eos", [False, True])
@pytest.mark.parametrize("outputs", [0, 3, 4, 5])
def test_min_tokens_is_transformers(outputs: int, ignore_eos: bool) -> None:
    """Stop tokens and EOS (unless ignored) are banned while fewer than min_tokens are out."""
    ids, prompt = history(2, prompt=10, output=outputs)
    params = SamplingParams(min_tokens=4, stop_token_ids=(5, 9), ignore_eos=ignore_eos)
    x = logits(1, seed=2)
    banned = [5, 9] + ([] if ignore_eos else sorted(EOS))
    reference = MinNewTokensLengthLogitsProcessor(prompt, 4, banned)
    ref = reference(torch.tensor([ids]), x.clone())
    assert torch.equal(process(x, [Row(params, ids, prompt)], EOS), ref)
    assert (ref[0, banned] == float("-inf")).all() == (outputs < 4)


def test_logit_bias_is_a_one_token_sequence_bias() -> None:
    bias = {3: 100.0, 10: -100.0, 63: 0.25, 0: -1.5}
    r = row(3, logit_bias=bias)
    x = logits(1, seed=3)
    reference = SequenceBiasLogitsProcessor([[[t], b] for t, b in bias.items()])
    ref = reference(torch.tensor([r.token_ids]), x.clone())
    assert torch.equal(process(x, [r], EOS), ref)


def openai_penalties(
    x: list[float], outputs: list[int], frequency: float, presence: float
) -> list[float]:
    """OpenAI's documented formula, token by token:
    ``mu[j] - c[j] * alpha_frequency - float(c[j] > 0) * alpha_presence``."""
    counts = {t: outputs.count(t) for t in set(outputs)}
    return [
        mu - counts.get(j, 0) * frequency - float(counts.get(j, 0) > 0) * presence
        for j, mu in enumerate(x)
    ]


@pytest.mark.parametrize(("frequency", "presence"), [(0.7, 0.0), (0.0, -1.2), (2.0, 2.0)])
def test_presence_and_frequency_follow_openais_formula(frequency: float, presence: float) -> None:
    """Counted over output tokens only: a token only in the prompt is not penalized."""
    r = row(4, frequency_penalty=frequency, presence_penalty=presence)
    x = logits(1, seed=4)
    outputs = r.token_ids[r.num_prompt_tokens :]
    expected = torch.tensor([openai_penalties(x[0].tolist(), outputs, frequency, presence)])
    torch.testing.assert_close(process(x, [r], EOS), expected, rtol=0, atol=1e-5)
    prompt_only = set(r.token_ids[: r.num_prompt_tokens]) - set(outputs)
    assert prompt_only
    for t in prompt_only:
        assert process(x, [r], EOS)[0, t] == x[0, t]


def test_the_order_is_bias_then_min_tokens_then_penalties() -> None:
    """vLLM's order; a banned token stays banned whatever its bias."""
    ids, prompt = history(5)
    params = SamplingParams(
        max_tokens=32,
        logit_bias={ids[0]: 3.0, 2: 50.0},
        min_tokens=20,
        repetition_penalty=1.7,
        frequency_penalty=0.4,
        presence_penalty=0.3,
    )
    x = logits(1, seed=5)
    step = x.clone()
    step[0, ids[0]] += 3.0
    step[0, 2] += 50.0
    step = MinNewTokensLengthLogitsProcessor(prompt, 20, sorted(EOS))(torch.tensor([ids]), step)
    step = RepetitionPenaltyLogitsProcessor(1.7)(torch.tensor([ids]), step)
    expected = torch.tensor([openai_penalties(step[0].tolist(), ids[prompt:], 0.4, 0.3)])
    got = process(x, [Row(params, ids, prompt)], EOS)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    assert got[0, 2] == float("-inf")


def mixed_rows() -> list[Row]:
    return [
        row(10),  # no processor
        row(11, repetition_penalty=1.5),
        row(12, frequency_penalty=1.0, presence_penalty=-0.5, temperature=0),
        row(13, logit_bias={4: 5.0, 40: -7.0}),
        row(14, min_tokens=30, stop_token_ids=(1,)),
        row(15, min_tokens=3),  # has its outputs already: nothing banned
        row(16, logit_bias={4: -5.0}, repetition_penalty=0.8, presence_penalty=2.0),
        Row(SamplingParams(repetition_penalty=1.2, frequency_penalty=1.0), [8], 1),  # no output
    ]


def test_a_batch_equals_its_rows_one_at_a_time() -> None:
    rows = mixed_rows()
    x = logits(len(rows), seed=6)
    before = x.clone()
    batched = process(x, rows, EOS)
    assert torch.equal(x, before), "the input logits were changed"
    for i, r in enumerate(rows):
        assert torch.equal(batched[i : i + 1], process(x[i : i + 1], [r], EOS)), i
    assert torch.equal(batched[0], x[0]) and not torch.equal(batched[1], x[1])


def test_a_batch_without_processors_is_returned_as_it_is() -> None:
    rows = [row(20), row(21, min_tokens=2), row(22, temperature=0, top_k=3)]
    x = logits(3, seed=7)
    assert process(x, rows, EOS) is x


def test_a_token_outside_the_vocabulary_raises() -> None:
    r = row(30, logit_bias={VOCAB: 1.0})
    with pytest.raises((IndexError, RuntimeError)):
        process(logits(1), [r], EOS)

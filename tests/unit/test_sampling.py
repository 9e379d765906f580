from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, cast

import pytest
import torch

from proto import worker_pb2 as pb
from proto.limits import (
    MAX_LOGIT_BIAS,
    MAX_STOP_STRING_CHARS,
    MAX_STOP_STRINGS,
    MAX_STOP_TOKEN_IDS,
    MIN_TEMPERATURE,
)
from workers.core.sampling import _filter_top_k_top_p, greedy, make_generator, sample
from workers.core.sequence import SamplingParams
from workers.serve.wire import sampling_params

CPU = torch.device("cpu")


def test_greedy_is_argmax() -> None:
    logits = torch.tensor([[0.1, 3.0, 2.0], [5.0, -1.0, 4.9]])
    params = [SamplingParams(temperature=0)] * 2
    assert sample(logits, params, [None, None]) == [1, 0]


def test_top_k_one_and_tiny_top_p_are_greedy() -> None:
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    params = [SamplingParams(temperature=1.0, top_k=1), SamplingParams(top_p=1e-6)] * 2
    gens = [make_generator(i, CPU) for i in range(4)]
    assert sample(logits, params, gens) == logits.argmax(-1).tolist()


def test_filter_keeps_exactly_top_k_and_nucleus() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.5, 0.3, 0.15, 0.05]]))
    out = _filter_top_k_top_p(logits, torch.tensor([2, 0]), torch.tensor([1.0, 0.7]))
    kept = torch.isfinite(out)
    assert kept.tolist() == [[True, True, False, False], [True, True, False, False]]
    out = _filter_top_k_top_p(logits, torch.tensor([0]), torch.tensor([0.85]))
    assert torch.isfinite(out[0]).tolist() == [True, True, True, False]


def test_seeded_request_is_reproducible_whatever_its_batch() -> None:
    logits = torch.randn(3, 1000, generator=torch.Generator().manual_seed(1))
    p = SamplingParams(temperature=1.0, seed=42)
    alone = [sample(logits[:1], [p], [make_generator(42, CPU)])[0] for _ in range(1)]
    other = SamplingParams(temperature=0.8)
    gens = [None, make_generator(42, CPU), None]
    batched = sample(logits[[1, 0, 2]], [other, p, other], gens)
    assert batched[1] == alone[0]


def test_sampling_follows_the_distribution() -> None:
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]])).repeat(4000, 1)
    params = [SamplingParams(temperature=1.0)] * 4000
    g = make_generator(0, CPU)
    counts = torch.bincount(torch.tensor(sample(logits, params, [g] * 4000)), minlength=3)
    freq = counts.float() / 4000
    assert torch.allclose(freq, torch.tensor([0.7, 0.2, 0.1]), atol=0.03)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": -1}, "temperature"),
        ({"temperature": 1e-40}, "temperature"),  # overflows fp32: NaN probabilities
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": float("inf")}, "temperature"),
        ({"top_p": float("nan")}, "top_p"),
        ({"top_p": 0}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"stop": ("",)}, "stop"),
        ({"stop": ("x",) * (MAX_STOP_STRINGS + 1)}, f"stop must have at most {MAX_STOP_STRINGS}"),
        ({"stop": ("x" * (MAX_STOP_STRING_CHARS + 1),)}, f"at most {MAX_STOP_STRING_CHARS} char"),
        ({"stop_token_ids": tuple(range(MAX_STOP_TOKEN_IDS + 1))}, "stop_token_ids"),
        ({"logit_bias": dict.fromkeys(range(MAX_LOGIT_BIAS + 1), 1.0)}, "logit_bias must have"),
        ({"logit_bias": {-1: 1.0}}, "logit_bias token ids"),
        ({"logit_bias": {5: 100.01}}, "logit_bias values"),
        ({"logit_bias": {5: float("nan")}}, "logit_bias values"),
        ({"presence_penalty": 2.01}, "presence_penalty"),
        ({"frequency_penalty": float("-inf")}, "frequency_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"repetition_penalty": float("nan")}, "repetition_penalty"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"min_tokens": 17}, "min_tokens"),  # over max_tokens (16)
    ],
)
def test_params_validation(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)  # type: ignore[arg-type]


def test_the_smallest_temperature_samples_like_greedy() -> None:
    """At the floor the division stays finite and the top token takes all the mass."""
    logits = torch.randn(3, 1000)
    params = [SamplingParams(temperature=MIN_TEMPERATURE, seed=i) for i in range(3)]
    generators = [make_generator(p.seed, logits.device) for p in params]
    assert sample(logits, params, generators) == greedy(logits)


def test_stop_limits_are_inclusive() -> None:
    SamplingParams(
        stop=("x" * MAX_STOP_STRING_CHARS,) * MAX_STOP_STRINGS,
        stop_token_ids=tuple(range(MAX_STOP_TOKEN_IDS)),
    )


def test_the_grpc_entrance_applies_the_stop_limits() -> None:
    ok = pb.SamplingParams(max_tokens=1, stop=["a"] * MAX_STOP_STRINGS, stop_token_ids=[1, 2])
    assert sampling_params(ok).stop == ("a",) * MAX_STOP_STRINGS
    ids = range(MAX_STOP_TOKEN_IDS + 1)
    for bad, field in [
        (pb.SamplingParams(max_tokens=1, stop=["a"] * (MAX_STOP_STRINGS + 1)), "stop"),
        (pb.SamplingParams(max_tokens=1, stop=["a" * (MAX_STOP_STRING_CHARS + 1)]), "stop"),
        (pb.SamplingParams(max_tokens=1, stop_token_ids=ids), "stop_token_ids"),
    ]:
        with pytest.raises(ValueError, match=field):
            sampling_params(bad)


class Uncopyable(list[str]):
    """A list whose items must not be read."""

    def __iter__(self) -> Iterator[str]:
        raise AssertionError("the list was copied before its length was checked")


def test_the_grpc_entrance_counts_stop_strings_before_copying_them() -> None:
    msg = SimpleNamespace(stop=Uncopyable(["a"] * (MAX_STOP_STRINGS + 1)), stop_token_ids=[])
    with pytest.raises(ValueError, match="stop must have at most"):
        sampling_params(cast(pb.SamplingParams, msg))


class UncopyableMap(dict[int, float]):
    """A map whose entries must not be read (only its size)."""

    def __iter__(self) -> Iterator[int]:
        raise AssertionError("the map was copied before its size was checked")

    def keys(self) -> Any:
        raise AssertionError("the map was copied before its size was checked")

    items = values = keys


def test_the_grpc_entrance_counts_logit_bias_before_copying_it() -> None:
    bias = UncopyableMap(dict.fromkeys(range(MAX_LOGIT_BIAS + 1), 1.0))
    msg = SimpleNamespace(stop=[], stop_token_ids=[], logit_bias=bias)
    with pytest.raises(ValueError, match="logit_bias must have at most"):
        sampling_params(cast(pb.SamplingParams, msg))


def test_the_grpc_entrance_takes_the_processing_fields() -> None:
    msg = pb.SamplingParams(
        max_tokens=8,
        logit_bias={3: 2.5, 9: -100},
        presence_penalty=0.5,
        frequency_penalty=-2,
        repetition_penalty=1.25,
        min_tokens=8,
    )
    assert sampling_params(msg) == SamplingParams(
        max_tokens=8,
        temperature=0,
        logit_bias={3: 2.5, 9: -100.0},
        presence_penalty=0.5,
        frequency_penalty=-2.0,
        repetition_penalty=1.25,
        min_tokens=8,
    )
    assert sampling_params(pb.SamplingParams(max_tokens=1)).repetition_penalty == 1.0  # unset
    for bad, field in [
        (pb.SamplingParams(max_tokens=1, repetition_penalty=0), "repetition_penalty"),
        (pb.SamplingParams(max_tokens=1, presence_penalty=3), "presence_penalty"),
        (pb.SamplingParams(max_tokens=1, logit_bias={1: 101}), "logit_bias"),
        (pb.SamplingParams(max_tokens=4, min_tokens=5), "min_tokens"),
    ]:
        with pytest.raises(ValueError, match=field):
            sampling_params(bad)


def test_params_keep_their_logit_bias_whatever_the_caller_does() -> None:
    bias = {1: 2.0}
    params = SamplingParams(logit_bias=bias)
    bias[1] = 500.0
    bias[2] = 1.0
    assert dict(params.logit_bias) == {1: 2.0}
    with pytest.raises(TypeError):
        params.logit_bias[1] = 3.0  # type: ignore[index]

"""A worker's logprobs are checked before they reach an answer: the shape the request
asked for, or a 502 for that request (router/flow/types.py ``checked_logprobs``)."""

from __future__ import annotations

import pytest

from proto import worker_pb2 as pb
from router.errors import APIError
from router.flow.types import checked_logprobs, sampling_params


def lp(top: int, values: int | None = None) -> pb.TokenLogprob:
    n = top if values is None else values
    return pb.TokenLogprob(logprob=-1.0, top_ids=list(range(top)), top_logprobs=[-1.0] * n)


def test_the_asked_shape_passes() -> None:
    params = sampling_params(4, 0.0, 1.0, 0, None, (), logprobs=2)
    assert checked_logprobs([lp(2), lp(2)], 2, params, "logprobs", "w") == (lp(2), lp(2))
    plain = sampling_params(4, 0.0, 1.0, 0, None, ())
    assert checked_logprobs([], 3, plain, "logprobs", "w") == ()
    assert checked_logprobs([], 0, params, "logprobs", "w") == ()


@pytest.mark.parametrize(
    "values",
    [
        [],  # asked for, none came
        [lp(2)],  # one short
        [lp(2), lp(3)],  # more alternatives than asked
        [lp(2), lp(2, values=1)],  # ids and values of different lengths
    ],
)
def test_any_other_shape_is_a_502(values: list[pb.TokenLogprob]) -> None:
    params = sampling_params(4, 0.0, 1.0, 0, None, (), logprobs=2)
    with pytest.raises(APIError) as bad:
        checked_logprobs(values, 2, params, "logprobs", "w")
    assert bad.value.status == 502


def test_unasked_logprobs_are_a_502() -> None:
    plain = sampling_params(4, 0.0, 1.0, 0, None, ())
    with pytest.raises(APIError):
        checked_logprobs([lp(0)], 1, plain, "logprobs", "w")

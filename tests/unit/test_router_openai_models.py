"""Request validation at the HTTP edge: accepted shapes and exact OpenAI error bodies."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.types import completion_create_params
from openai.types.chat import completion_create_params as chat_create_params

from proto.limits import (
    MAX_LOGIT_BIAS,
    MAX_STOP_STRING_CHARS,
    MAX_STOP_STRINGS,
    MAX_STOP_TOKEN_IDS,
    MAX_TOKEN_ID,
)
from router.api.openai_fields import IGNORED, REFUSED
from router.api.openai_models import ChatCompletionRequest, CompletionRequest
from router.api.openai_parse import parse_request
from router.errors import APIError
from workers.core.sequence import SamplingParams
from workers.serve.wire import sampling_params


def completion(**fields: Any) -> CompletionRequest:
    req = parse_request(CompletionRequest, json.dumps({"model": "m", **fields}).encode())
    req.check()
    return req


def chat(**fields: Any) -> ChatCompletionRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    req = parse_request(ChatCompletionRequest, json.dumps(body).encode())
    req.check()
    return req


def error_of(fn: Any, **fields: Any) -> tuple[int, dict[str, Any]]:
    with pytest.raises(APIError) as info:
        fn(**fields)
    return info.value.status, info.value.body()


def test_prompt_shapes() -> None:
    assert completion(prompt="hello").prompt_input() == "hello"
    assert completion(prompt=[1, 2, 3]).prompt_input() == [1, 2, 3]
    assert completion(prompt=["hello"]).prompt_input() == "hello"
    assert completion(prompt=[[4, 5]]).prompt_input() == [4, 5]


def test_defaults_and_extensions() -> None:
    req = completion(prompt="x", stop="\n", top_k=5, stream=True,
                     stream_options={"include_usage": True}, user="u", logit_bias=None)  # fmt: skip
    assert req.max_tokens == 16
    assert req.temperature is None and req.top_p is None and req.seed is None
    assert req.stop_list == ["\n"] and req.top_k == 5 and req.include_usage
    assert chat(stop=["a", "b"]).stop_list == ["a", "b"]
    assert chat(max_tokens=5, max_completion_tokens=7).output_limit == 7
    assert chat().output_limit is None
    assert chat(return_token_ids=True).return_token_ids
    assert completion(prompt="x", return_token_ids=False).return_token_ids is False
    assert error_of(chat, return_token_ids=1)[1]["error"]["code"] == "invalid_type"


def test_chat_content_parts_and_roles() -> None:
    req = chat(messages=[
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    ])  # fmt: skip
    assert [m.to_template() for m in req.messages] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "ab"},
    ]


def test_missing_model() -> None:
    with pytest.raises(APIError) as info:
        parse_request(CompletionRequest, b'{"prompt": "x"}')
    assert info.value.status == 400
    assert info.value.body() == {
        "error": {
            "message": "Missing required parameter: 'model'.",
            "type": "invalid_request_error",
            "param": "model",
            "code": "missing_required_parameter",
        }
    }


def test_bad_json_and_non_object() -> None:
    for body in (b"{not json", b"[1, 2]"):
        with pytest.raises(APIError) as info:
            parse_request(CompletionRequest, body)
        err = info.value.body()["error"]
        assert info.value.status == 400 and err["type"] == "invalid_request_error"
        assert err["param"] is None


def test_out_of_range_values() -> None:
    status, body = error_of(completion, prompt="x", temperature=3)
    assert status == 400
    assert body == {
        "error": {
            "message": "Invalid value for 'temperature': Input should be less than or equal to 2.",
            "type": "invalid_request_error",
            "param": "temperature",
            "code": "invalid_value",
        }
    }
    tiny = error_of(chat, temperature=1e-40)
    assert tiny[0] == 400 and tiny[1]["error"]["param"] == "temperature"
    assert completion(prompt="x", temperature=0).temperature == 0
    assert completion(prompt="x", temperature=1e-5).temperature == 1e-5
    assert error_of(completion, prompt="x", max_tokens=0)[1]["error"]["param"] == "max_tokens"
    assert error_of(completion, prompt="x", top_p=0)[1]["error"]["param"] == "top_p"
    assert error_of(completion, prompt=[1, -2])[1]["error"]["param"] == "prompt.1"
    err = error_of(completion, prompt="x", max_tokens="many")[1]["error"]
    assert (err["param"], err["code"]) == ("max_tokens", "invalid_type")
    for bad in (-1, 1 << 32):
        assert error_of(completion, prompt="x", max_tokens=bad)[1]["error"]["param"] == "max_tokens"
    assert error_of(completion, prompt="x", top_k=1 << 32)[1]["error"]["param"] == "top_k"
    err = error_of(chat, max_completion_tokens=0)[1]["error"]
    assert (err["param"], err["code"]) == ("max_completion_tokens", "invalid_value")


def test_cache_salt() -> None:
    assert completion(prompt="x").cache_salt is None
    assert completion(prompt="x", cache_salt="s" * 256).cache_salt == "s" * 256
    assert chat(cache_salt="tenant-a").cache_salt == "tenant-a"
    err = error_of(chat, cache_salt="s" * 257)[1]["error"]
    assert (err["param"], err["code"]) == ("cache_salt", "invalid_value")
    err = error_of(completion, prompt="x", cache_salt=5)[1]["error"]
    assert (err["param"], err["code"]) == ("cache_salt", "invalid_type")


def test_unsupported_features() -> None:
    cases: list[tuple[Any, dict[str, Any], str]] = [
        (completion, {"prompt": "x", "n": 17}, "n"),
        (completion, {"prompt": "x", "n": 0}, "n"),
        (completion, {"prompt": "x", "logprobs": 21}, "logprobs"),
        (completion, {"prompt": "x", "echo": 1}, "echo"),
        (completion, {"prompt": "x", "best_of": 3}, "best_of"),
        (completion, {"prompt": ["a", "b"]}, "prompt"),
        (completion, {"prompt": []}, "prompt"),
        (completion, {"prompt": "x", "presence_penalty": 2.5}, "presence_penalty"),
        (chat, {"tool_choice": "required"}, "tool_choice"),
        (chat, {"response_format": {"type": "json_object"}}, "response_format"),
        (completion, {"prompt": "x", "stop": ["", "a"]}, "stop"),
        (chat, {"messages": []}, "messages"),
        (chat, {"top_logprobs": 2}, "top_logprobs"),
        (chat, {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        (chat, {"tools": [{"type": "function"}]}, "tools"),
    ]
    for fn, fields, param in cases:
        status, body = error_of(fn, **fields)
        assert status == 400, fields
        assert body["error"]["param"] == param, fields
        assert body["error"]["type"] == "invalid_request_error"
    assert error_of(chat, top_logprobs=2)[1]["error"] == {
        "message": "logprobs must be set to true if top_logprobs is used",
        "type": "invalid_request_error",
        "param": "top_logprobs",
        "code": None,
    }


def test_logprobs_echo_and_n_reach_the_wire() -> None:
    """A completion's ``logprobs`` count is each output token's; with ``echo`` the prompt's
    too; a chat's ``top_logprobs`` counts only with ``logprobs``; ``n`` is the request's."""
    plain = completion(prompt="x").wire_params(4)
    assert not plain.HasField("logprobs") and not plain.HasField("prompt_logprobs")
    req = completion(prompt="x", logprobs=0, n=3)
    wire = req.wire_params(4)
    assert (wire.logprobs, wire.HasField("prompt_logprobs"), req.n) == (0, False, 3)
    echoed = completion(prompt="x", logprobs=5, echo=True).wire_params(4)
    assert (echoed.logprobs, echoed.prompt_logprobs) == (5, 5)
    assert not completion(prompt="x", echo=True).wire_params(4).HasField("prompt_logprobs")
    assert chat(logprobs=True, top_logprobs=20).wire_params(4).logprobs == 20
    assert chat(logprobs=True).wire_params(4).logprobs == 0
    assert not chat(logprobs=False).wire_params(4).HasField("logprobs")


def test_stop_limits() -> None:
    """Stop strings are capped in number and length (the worker checks the same limits)."""
    most = ["x" * MAX_STOP_STRING_CHARS] * MAX_STOP_STRINGS
    assert completion(prompt="x", stop=most).stop_list == most
    assert chat(stop="y" * MAX_STOP_STRING_CHARS).stop_list == ["y" * MAX_STOP_STRING_CHARS]
    status, body = error_of(chat, stop=["x"] * (MAX_STOP_STRINGS + 1))
    assert status == 400
    assert body["error"] == {
        "message": f"stop must have at most {MAX_STOP_STRINGS} items, got {MAX_STOP_STRINGS + 1}",
        "type": "invalid_request_error",
        "param": "stop",
        "code": "invalid_value",
    }
    too_long = "z" * (MAX_STOP_STRING_CHARS + 1)
    for stop in (too_long, ["a", too_long]):
        err = error_of(completion, prompt="x", stop=stop)[1]["error"]
        assert (err["param"], err["code"]) == ("stop", "invalid_value")
        assert f"at most {MAX_STOP_STRING_CHARS} characters" in err["message"]


@pytest.mark.parametrize(
    ("stop", "valid"),
    [
        (["a", "bc"], True),
        ([""], False),
        (["x"] * MAX_STOP_STRINGS, True),
        (["x"] * (MAX_STOP_STRINGS + 1), False),
        (["é" * MAX_STOP_STRING_CHARS], True),  # characters, not UTF-8 bytes
        (["é" * (MAX_STOP_STRING_CHARS + 1)], False),
    ],
)
def test_the_router_and_a_worker_refuse_the_same_stop_strings(stop: list[str], valid: bool) -> None:
    assert accepted(lambda: chat(stop=stop)) is valid
    assert accepted(lambda: SamplingParams(stop=tuple(stop))) is valid


def test_bad_chat_messages() -> None:
    err = error_of(chat, messages=[{"role": "robot", "content": "x"}])[1]["error"]
    assert err["param"] == "messages.0.role" and err["code"] == "invalid_value"
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]
    assert error_of(chat, messages=image)[1]["error"]["param"].startswith("messages.0.content")


def test_server_errors_have_server_error_type() -> None:
    assert APIError(503, "busy", None, "service_unavailable").body()["error"]["type"] == (
        "server_error"
    )


def accepted(check: Any) -> bool:
    try:
        check()
    except (APIError, ValueError):
        return False
    return True


def bias(count: int, value: float = 1.0) -> dict[str, float]:
    return {str(t): value for t in range(count)}


PROCESSING_CASES: list[tuple[dict[str, Any], bool]] = [
    ({"logit_bias": {"50256": 100}}, True),
    ({"logit_bias": {"1": -100, "2": 0.5}}, True),
    ({"logit_bias": {"1": 100.5}}, False),
    ({"logit_bias": {"1": -101}}, False),
    ({"logit_bias": {"1": float("nan")}}, False),
    ({"logit_bias": bias(MAX_LOGIT_BIAS)}, True),
    ({"logit_bias": bias(MAX_LOGIT_BIAS + 1)}, False),
    ({"logit_bias": {str(MAX_TOKEN_ID): 1}}, True),
    ({"logit_bias": {str(MAX_TOKEN_ID + 1): 1}}, False),
    ({"logit_bias": {"-1": 1}}, False),
    ({"presence_penalty": 2}, True),
    ({"presence_penalty": -2.0}, True),
    ({"presence_penalty": 2.0001}, False),
    ({"presence_penalty": float("inf")}, False),
    ({"frequency_penalty": -1.5}, True),
    ({"frequency_penalty": -2.5}, False),
    ({"frequency_penalty": float("nan")}, False),
    ({"repetition_penalty": 1}, True),
    ({"repetition_penalty": 0.01}, True),
    ({"repetition_penalty": 100}, True),
    ({"repetition_penalty": 0.0099}, False),
    ({"repetition_penalty": 0}, False),
    ({"repetition_penalty": -1.2}, False),
    ({"repetition_penalty": 100.5}, False),
    ({"min_tokens": 0}, True),
    ({"min_tokens": 16}, True),  # a completion's default max_tokens
    ({"min_tokens": 17}, False),
    ({"min_tokens": 5, "max_tokens": 5}, True),
    ({"min_tokens": 6, "max_tokens": 5}, False),
    ({"stop_token_ids": list(range(MAX_STOP_TOKEN_IDS))}, True),
    ({"stop_token_ids": list(range(MAX_STOP_TOKEN_IDS + 1))}, False),
]


def worker_params(fields: dict[str, Any]) -> SamplingParams:
    """The same request made to a worker directly (token ids as ints, not JSON keys)."""
    kwargs = dict(fields)
    if "logit_bias" in kwargs:
        kwargs["logit_bias"] = {int(k): v for k, v in kwargs["logit_bias"].items()}
    if "stop_token_ids" in kwargs:
        kwargs["stop_token_ids"] = tuple(kwargs["stop_token_ids"])
    return SamplingParams(**kwargs)


@pytest.mark.parametrize(("fields", "valid"), PROCESSING_CASES)
def test_the_router_and_a_worker_refuse_the_same_processing_fields(
    fields: dict[str, Any], valid: bool
) -> None:
    """One table for both entrances; what the router accepts reaches a worker over the
    wire as exactly the params a direct caller would make."""
    assert accepted(lambda: completion(prompt="x", **fields)) is valid
    assert accepted(lambda: worker_params(fields)) is valid
    if valid:
        req = completion(prompt="x", **fields)
        wire = req.wire_params(req.output_limit)
        assert sampling_params(wire) == worker_params({"max_tokens": 16, **fields})


def test_processing_refusals_name_their_field() -> None:
    for fields, valid in PROCESSING_CASES:
        if not valid:
            err = error_of(completion, prompt="x", **fields)[1]["error"]
            assert (err["param"], err["code"]) == (next(iter(fields)), "invalid_value"), fields
    for key in ("abc", "1.5", " 1", "+1", "\u0661", "9" * 21):
        err = error_of(completion, prompt="x", logit_bias={key: 1})[1]["error"]
        assert err["param"] == "logit_bias" and "token ids" in err["message"], key
    err = error_of(completion, prompt="x", logit_bias={"1": "big"})[1]["error"]
    assert (err["param"], err["code"]) == ("logit_bias.1", "invalid_type")


def test_processing_fields_are_forwarded() -> None:
    req = chat(
        logit_bias={"50256": 100, "7": -3.5},
        presence_penalty=0.5,
        frequency_penalty=-0.25,
        repetition_penalty=1.3,
        min_tokens=3,
        stop_token_ids=[2, 9],
        max_tokens=12,
    )
    wire = req.wire_params(12)
    assert dict(wire.logit_bias) == {50256: 100.0, 7: -3.5}
    assert (wire.presence_penalty, wire.frequency_penalty) == (0.5, -0.25)
    assert wire.repetition_penalty == 1.3 and wire.min_tokens == 3
    assert list(wire.stop_token_ids) == [2, 9]
    plain = chat().wire_params(5)
    assert not plain.HasField("repetition_penalty") and not plain.logit_bias
    assert sampling_params(plain) == SamplingParams(max_tokens=5)


@pytest.mark.parametrize("value", [1e-5, 0.1234567891, 1.9999999])
def test_sampling_floats_cross_the_wire_unchanged(value: float) -> None:
    """Temperature and top_p reach a worker exactly as the router checked them (a fp32
    field once turned 1e-5, the smallest temperature the router takes, into a refusal)."""
    params = sampling_params(chat(temperature=value, top_p=min(value, 1.0)).wire_params(4))
    assert (params.temperature, params.top_p) == (value, min(value, 1.0))


REALISTIC_REFUSALS: list[tuple[str, Any]] = [
    ("tools", [{"type": "function", "function": {"name": "f"}}]),
    ("tool_choice", {"type": "function", "function": {"name": "f"}}),
    ("functions", [{"name": "f"}]),
    ("function_call", {"name": "f"}),
    ("response_format", {"type": "json_schema", "json_schema": {"name": "x"}}),
    ("modalities", ["text", "audio"]),
    ("audio", {"voice": "alloy", "format": "wav"}),
    ("reasoning_effort", "high"),
    ("min_p", 0.1),
    ("use_beam_search", True),
    ("guided_json", {"type": "object"}),
    ("skip_special_tokens", False),
    ("add_generation_prompt", False),
    ("best_of", 2),
    ("priority", 1),
]


@pytest.mark.parametrize(("name", "value"), REALISTIC_REFUSALS)
def test_unsupported_fields_are_refused_by_name(name: str, value: Any) -> None:
    status, body = error_of(chat, **{name: value})
    assert status == 400
    assert body["error"]["param"] == name and body["error"]["code"] == "unsupported_value"
    assert body["error"]["message"].startswith(f"{name} is not supported")


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_every_refused_field_passes_when_off_and_fails_when_on(name: str) -> None:
    for fn, extra in ((chat, {}), (completion, {"prompt": "x"})):
        assert accepted(lambda fn=fn, extra=extra: fn(**extra, **{name: None}))
        for off in REFUSED[name]:
            assert accepted(lambda fn=fn, extra=extra, off=off: fn(**extra, **{name: off}))
        assert error_of(fn, **extra, **{name: "on"})[1]["error"]["param"] == name


def test_off_values_keep_their_json_type() -> None:
    """``0`` is not ``false``, nor ``"1"`` a ``1``."""
    assert error_of(chat, logprobs=0)[1]["error"]["param"] == "logprobs"  # strict: a bool
    assert error_of(completion, prompt="x", best_of="1")[1]["error"]["param"] == "best_of"
    assert chat(min_p=0, length_penalty=1.0, tool_choice="auto", tools=[], logprobs=False)


def test_add_special_tokens_is_refused_where_it_differs_from_ours() -> None:
    """Completions tokenize their text with special tokens; the chat template places its own."""
    assert completion(prompt="x", add_special_tokens=True)
    assert chat(add_special_tokens=False)
    err = error_of(completion, prompt="x", add_special_tokens=False)[1]["error"]
    assert err["param"] == "add_special_tokens"
    assert error_of(chat, add_special_tokens=True)[1]["error"]["param"] == "add_special_tokens"


def test_harmless_fields_are_accepted() -> None:
    fields = {name: {"any": "value"} for name in IGNORED}
    assert chat(**fields) and completion(prompt="x", **fields)


def openai_fields(params: Any) -> set[str]:
    create = params.CompletionCreateParamsStreaming
    return set(create.__required_keys__ | create.__optional_keys__)


def test_every_openai_request_field_is_implemented_refused_or_harmless() -> None:
    """A field the openai package knows and nobody classified would be ignored silently."""
    for params, model in (
        (completion_create_params, CompletionRequest),
        (chat_create_params, ChatCompletionRequest),
    ):
        unclassified = openai_fields(params) - set(model.model_fields) - set(REFUSED) - IGNORED
        assert not unclassified, model.__name__
    assert not set(REFUSED) & IGNORED
    for model in (CompletionRequest, ChatCompletionRequest):
        assert not set(model.model_fields) & (set(model.refused) | IGNORED)

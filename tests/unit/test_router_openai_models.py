"""Request validation at the HTTP edge: accepted shapes and exact OpenAI error bodies."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proto.limits import MAX_STOP_STRING_CHARS, MAX_STOP_STRINGS
from router.errors import APIError
from router.openai_models import ChatCompletionRequest, CompletionRequest, parse_request
from workers.sequence import SamplingParams


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
        (completion, {"prompt": "x", "n": 2}, "n"),
        (completion, {"prompt": "x", "echo": True}, "echo"),
        (completion, {"prompt": "x", "logprobs": 2}, "logprobs"),
        (completion, {"prompt": "x", "best_of": 3}, "best_of"),
        (completion, {"prompt": ["a", "b"]}, "prompt"),
        (completion, {"prompt": []}, "prompt"),
        (completion, {"prompt": "x", "presence_penalty": 0.5}, "presence_penalty"),
        (completion, {"prompt": "x", "stop": ["", "a"]}, "stop"),
        (chat, {"n": 3}, "n"),
        (chat, {"messages": []}, "messages"),
        (chat, {"logprobs": True}, "logprobs"),
        (chat, {"tools": [{"type": "function"}]}, "tools"),
    ]
    for fn, fields, param in cases:
        status, body = error_of(fn, **fields)
        assert status == 400, fields
        assert body["error"]["param"] == param, fields
        assert body["error"]["type"] == "invalid_request_error"
    assert error_of(completion, prompt="x", n=2)[1]["error"] == {
        "message": "only n=1 is supported",
        "type": "invalid_request_error",
        "param": "n",
        "code": "unsupported_value",
    }


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
    def accepted(check: Any) -> bool:
        try:
            check()
        except (APIError, ValueError):
            return False
        return True

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

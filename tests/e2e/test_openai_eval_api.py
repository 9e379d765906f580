"""What evaluation and sampling tools ask of the OpenAI API, on real processes (issue 20):
a prefill and a decode worker on the tiny model (every request disaggregated), talked to
with the official ``openai`` client.

- completions ``logprobs`` (streamed and whole) and ``echo`` with the prompt's logprobs
  (lm-evaluation-harness's loglikelihood request: token ids, ``max_tokens`` 1,
  ``logprobs`` 1, ``echo``), chat ``logprobs`` / ``top_logprobs``: every value equal to
  transformers' log-softmax of the same ids within 1e-4;
- ``n`` samples: ``n`` choices, the prompt computed once (the workers' computed-token
  counters), seeded samples reproducible and different from each other;
- ``/tokenize`` and ``/detokenize`` round trips, ``/version``, ``X-Request-Id`` echoed;
- what is still refused, refused with a 400 naming the field.
"""

from __future__ import annotations

import json
import math
import urllib.request
from pathlib import Path
from typing import Any

import openai
import pytest

from kvserve.cluster.launch import Cluster
from tests.integration.reference import hf_logprobs
from tests.tiny_cluster import MODEL_NAME, cluster_client, prompt_of

ATOL = 1e-4


@pytest.fixture(scope="module")
def cluster(eval_cluster: Cluster) -> Cluster:
    """The cluster shared with the other evaluation-API tests (``conftest.py``)."""
    return eval_cluster


@pytest.fixture(scope="module")
def client(cluster: Cluster) -> openai.OpenAI:
    return cluster_client(cluster)


def post(cluster: Cluster, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
         ) -> tuple[int, dict[str, Any], dict[str, str]]:  # fmt: skip
    request = urllib.request.Request(
        cluster.router_url + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status, json.load(r), {k.lower(): v for k, v in r.headers.items()}
    except urllib.error.HTTPError as err:
        return err.code, json.load(err), {k.lower(): v for k, v in err.headers.items()}


def computed_tokens(cluster: Cluster) -> int:
    with urllib.request.urlopen(cluster.router_url + "/v1/cache/stats", timeout=10) as r:
        workers = json.load(r)["since_start"]["workers"]
    return sum(int(w["computed_tokens"]) for w in workers.values())


def test_completion_logprobs_whole_and_streamed(
    client: openai.OpenAI, tiny_model_dir: Path
) -> None:
    prompt = prompt_of(40, seed=1)
    kwargs: dict[str, Any] = {"max_tokens": 6, "temperature": 0, "logprobs": 3}
    whole = client.completions.create(model=MODEL_NAME, prompt=prompt, **kwargs)
    (choice,) = whole.choices
    lp = choice.logprobs
    assert lp is not None and lp.tokens and lp.token_logprobs and lp.top_logprobs
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    outputs = (
        client.completions.create(
            model=MODEL_NAME, prompt=prompt, extra_body={"return_token_ids": True}, **kwargs
        )
        .choices[0]
        .model_extra["token_ids"]
    )
    ref = hf_logprobs(tiny_model_dir, prompt + outputs[:-1])[len(prompt) - 1 :]
    for i, token in enumerate(outputs):
        assert math.isclose(lp.token_logprobs[i], float(ref[i, token]), abs_tol=ATOL)
        top = lp.top_logprobs[i]
        assert len(top) in (3, 4)  # the 3 best, and the token itself when not among them
        assert math.isclose(max(top.values()), float(ref[i].max()), abs_tol=ATOL)
        assert lp.token_logprobs[i] == max(top.values())  # greedy: the token is the best
    streamed = client.completions.create(model=MODEL_NAME, prompt=prompt, stream=True, **kwargs)
    got: list[float] = []
    offsets: list[int] = []
    for chunk in streamed:
        part = chunk.choices[0].logprobs
        if part is not None:
            got += part.token_logprobs or []
            offsets += part.text_offset or []
    # the same values (a cached prefix changes the kernels' shapes: within fp32 noise)
    assert len(got) == len(lp.token_logprobs) and offsets == lp.text_offset
    assert all(
        math.isclose(a, b, abs_tol=ATOL) for a, b in zip(got, lp.token_logprobs, strict=True)
    )


def test_echo_gives_the_prompts_logprobs_as_lm_eval_reads_them(
    client: openai.OpenAI, tiny_model_dir: Path
) -> None:
    prompt = prompt_of(70, seed=2)  # over several blocks: computed whole, not disaggregated
    reply = client.completions.create(
        model=MODEL_NAME, prompt=[prompt], max_tokens=1, temperature=0, logprobs=1, echo=True,
        seed=1234,
    )  # fmt: skip
    (choice,) = reply.choices
    lp = choice.logprobs
    assert lp is not None and lp.token_logprobs is not None and lp.top_logprobs is not None
    assert len(lp.token_logprobs) == len(prompt) + 1
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    ref = hf_logprobs(tiny_model_dir, prompt)
    for i in range(1, len(prompt)):
        assert math.isclose(lp.token_logprobs[i], float(ref[i - 1, prompt[i]]), abs_tol=ATOL)
        greedy = int(ref[i - 1].argmax()) == prompt[i]
        assert (lp.token_logprobs[i] == max(lp.top_logprobs[i].values())) == greedy
    assert choice.text.startswith(post_detokenize(client, prompt))


def post_detokenize(client: openai.OpenAI, ids: list[int]) -> str:
    base = str(client.base_url).removesuffix("/v1/")
    request = urllib.request.Request(
        base + "/detokenize",
        data=json.dumps({"model": MODEL_NAME, "tokens": ids}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as r:
        return str(json.load(r)["prompt"])


def test_chat_logprobs(client: openai.OpenAI, tiny_model_dir: Path) -> None:
    messages: list[Any] = [{"role": "user", "content": "Say something."}]
    reply = client.chat.completions.create(
        model=MODEL_NAME, messages=messages, max_tokens=4, temperature=0, logprobs=True,
        top_logprobs=2, extra_body={"return_token_ids": True},
    )  # fmt: skip
    (choice,) = reply.choices
    prompt = reply.model_extra["prompt_token_ids"]  # type: ignore[index]
    outputs = choice.model_extra["token_ids"]  # type: ignore[index]
    assert choice.logprobs is not None and choice.logprobs.content is not None
    content = choice.logprobs.content
    assert len(content) == len(outputs)
    ref = hf_logprobs(tiny_model_dir, prompt + outputs[:-1])[len(prompt) - 1 :]
    for i, (entry, token) in enumerate(zip(content, outputs, strict=True)):
        assert math.isclose(entry.logprob, float(ref[i, token]), abs_tol=ATOL)
        assert entry.bytes == list(entry.token.encode())
        assert len(entry.top_logprobs) == 2
        assert math.isclose(entry.top_logprobs[0].logprob, float(ref[i].max()), abs_tol=ATOL)


def test_n_samples_share_one_prefill(client: openai.OpenAI, cluster: Cluster) -> None:
    prompt = prompt_of(64, seed=3)  # 4 whole blocks
    before = computed_tokens(cluster)
    reply = client.completions.create(
        model=MODEL_NAME, prompt=prompt, max_tokens=5, temperature=1.0, seed=7, n=3
    )
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert reply.usage is not None and reply.usage.completion_tokens == 15
    assert reply.usage.prompt_tokens == 64
    # sample 0 computed the prompt; each later one only its last token (a prefix hit)
    assert computed_tokens(cluster) - before <= 64 + 2 * 16
    again = client.completions.create(
        model=MODEL_NAME, prompt=prompt, max_tokens=5, temperature=1.0, seed=7, n=3
    )
    texts = [c.text for c in reply.choices]
    assert [c.text for c in again.choices] == texts  # seeded: reproducible
    assert len(set(texts)) > 1  # and each sample its own seed
    chunks = client.completions.create(
        model=MODEL_NAME, prompt=prompt, max_tokens=5, temperature=1.0, seed=7, n=3, stream=True
    )
    streamed = ["", "", ""]
    finished = set()
    for chunk in chunks:
        for c in chunk.choices:
            streamed[c.index] += c.text
            if c.finish_reason:
                finished.add(c.index)
    assert streamed == texts and finished == {0, 1, 2}


def test_tokenize_detokenize_version_and_request_ids(cluster: Cluster) -> None:
    status, body, headers = post(
        cluster, "/tokenize", {"model": MODEL_NAME, "prompt": "Hello world"},
        {"X-Request-Id": "my-run-42"},
    )  # fmt: skip
    assert status == 200 and body["count"] == len(body["tokens"]) > 0
    assert headers["x-request-id"] == "my-run-42"
    status, back, _ = post(cluster, "/detokenize", {"model": MODEL_NAME, "tokens": body["tokens"]})
    assert status == 200 and back["prompt"].endswith("Hello world")
    status, chat, _ = post(
        cluster, "/tokenize", {"model": MODEL_NAME, "messages": [{"role": "user", "content": "x"}]}
    )
    assert status == 200 and chat["count"] > 1
    status, _, headers = post(
        cluster, "/v1/completions", {"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 2},
        {"X-Request-Id": "client-7"},
    )  # fmt: skip
    assert status == 200 and headers["x-request-id"] == "client-7"
    with urllib.request.urlopen(cluster.router_url + "/version", timeout=10) as r:
        assert json.load(r)["version"]
    status, err, _ = post(cluster, "/detokenize", {"model": MODEL_NAME, "tokens": [10**9]})
    assert status == 400 and err["error"]["param"] == "tokens"


@pytest.mark.parametrize(
    ("route", "fields", "param"),
    [
        ("/v1/completions", {"logprobs": 21}, "logprobs"),
        ("/v1/completions", {"n": 17}, "n"),
        ("/v1/completions", {"best_of": 2}, "best_of"),
        ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),
    ],
)
def test_still_refused(cluster: Cluster, route: str, fields: dict[str, Any], param: str) -> None:
    body: dict[str, Any] = {"model": MODEL_NAME, "max_tokens": 2, **fields}
    if route.endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": "x"}]
    else:
        body["prompt"] = "x"
    status, err, _ = post(cluster, route, body)
    assert status == 400 and err["error"]["param"] == param, err


def test_stop_strings_do_not_repeat_the_handed_off_token(client: openai.OpenAI) -> None:
    """The prefill worker's first token text, held back for a possible stop string, is
    released by the decode worker, once: the text is the answer's ids decoded (a bug
    lm-eval's ``generate_until`` found: the first token's text came twice)."""
    prompt = [65, 42, 3314, 288, 1296, 30, 198, 49, 42]
    reply = client.completions.create(
        model=MODEL_NAME, prompt=prompt, max_tokens=6, temperature=0,
        stop=["\n", "<|im_end|>"], extra_body={"return_token_ids": True},
    )  # fmt: skip
    (choice,) = reply.choices
    ids = choice.model_extra["token_ids"]  # type: ignore[index]
    assert choice.text == post_detokenize(client, ids)

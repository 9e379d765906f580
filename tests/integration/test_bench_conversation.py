"""vLLM's ``return_token_ids`` and the conversation workload of ``kvserve bench serve``,
against two mixed workers on the tiny model (router policy cache_aware).

- Through the official ``openai`` client, completions and chat completions, streamed and
  not, carry the token ids the engine generated (transformers' greedy ids) and the prompt's
  ids, where vLLM puts them.
- Every conversation turn is sent after the previous answer and carries the whole
  conversation so far as token ids, the answers' ids as returned: each turn finds the
  previous turn's prompt and answer cached up to the last full block of the KV that turn
  computed (prompt + answer - 1 tokens: the last sampled token's KV is never computed), on
  its worker or in the pool; an answer re-tokenized otherwise would break that chain
  within its first block. The rows summarise it per turn.

No timing assertions: only the order of events and the counts.
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai.types.chat import ChatCompletionMessageParam

from kvserve.bench import serve
from kvserve.cluster.launch import Cluster
from kvserve.loadgen.metrics import RequestRecord
from tests.integration.reference import hf_greedy
from tests.tiny_cluster import BLOCK, MODEL_NAME, cluster_client, prompt_of, tiny_cluster_spec

CONVERSATIONS, TURNS = 3, 3
ANSWER = 20  # > one block (--spread 0): the next turn must find the answer's own ids cached
IDS = {"return_token_ids": True, "ignore_eos": True}


@pytest.fixture(scope="module")
def cluster(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    spec = tiny_cluster_spec(
        tiny_model_dir, tmp_path_factory.mktemp("cluster"), prefill=0, decode=0, mixed=2,
        policy="cache_aware",
    )  # fmt: skip
    with Cluster(spec).start() as running:
        yield running


def extras(model: Any) -> dict[str, Any]:
    """The fields the openai types do not declare (vLLM's)."""
    return dict(model.model_extra or {})


def test_answers_carry_the_generated_and_the_prompts_token_ids(
    cluster: Cluster, tiny_model_dir: Path
) -> None:
    client = cluster_client(cluster)
    prompt, n = prompt_of(37, seed=5), 12
    expected = hf_greedy(tiny_model_dir, prompt, n)
    (choice,) = client.completions.create(
        prompt=prompt, model=MODEL_NAME, max_tokens=n, temperature=0, extra_body=IDS
    ).choices
    assert extras(choice) == {"token_ids": expected, "prompt_token_ids": prompt}
    stream = client.completions.create(
        prompt=prompt, model=MODEL_NAME, max_tokens=n, temperature=0, extra_body=IDS,
        stream=True, stream_options={"include_usage": True},
    )  # fmt: skip
    events = list(stream)
    chunks = [extras(e.choices[0]) for e in events if e.choices]
    assert [t for c in chunks for t in c["token_ids"]] == expected
    assert [c.get("prompt_token_ids") for c in chunks] == [prompt] + [None] * (len(chunks) - 1)
    assert events[-1].usage is not None and events[-1].usage.completion_tokens == n

    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Hello there!"}]
    reply = client.chat.completions.create(
        messages=messages, model=MODEL_NAME, max_tokens=n, temperature=0, extra_body=IDS
    )
    chat_prompt = extras(reply)["prompt_token_ids"]
    assert reply.usage is not None and len(chat_prompt) == reply.usage.prompt_tokens
    chat_expected = hf_greedy(tiny_model_dir, chat_prompt, n)
    assert extras(reply.choices[0]) == {"token_ids": chat_expected}
    role, *rest = client.chat.completions.create(
        messages=messages, model=MODEL_NAME, max_tokens=n, temperature=0, extra_body=IDS,
        stream=True,
    )  # fmt: skip
    assert extras(role) == {"prompt_token_ids": chat_prompt}
    assert [t for c in rest for t in extras(c.choices[0])["token_ids"]] == chat_expected


def test_conversations_grow_by_the_answers_ids_and_find_them_cached(
    cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "--url", cluster.router_url,
        "--workload", "conversation",
        "--conversations", str(CONVERSATIONS), "--turns", str(TURNS),
        "--first-prompt-len", "40", "--user-message-len", "4", "--answer-len", str(ANSWER),
        "--spread", "0", "--think-s", "0.2", "--rates", "inf", "--warmup", "0",
        "--no-progress", "--out", str(tmp_path),
    ]  # fmt: skip
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    assert serve.run(parser.parse_args(argv)) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["conditions"]["prompt_format"] == "ids"
    assert report["conditions"]["num_requests"] == CONVERSATIONS * TURNS
    lines = (tmp_path / "records_0.jsonl").read_text().splitlines()
    records = [RequestRecord(**{**json.loads(x), "chunk_times_s": ()}) for x in lines]
    assert [r.error for r in records] == [None] * CONVERSATIONS * TURNS
    pairs = [(r.conversation, r.turn) for r in records]
    assert pairs == [(c, t) for c in range(CONVERSATIONS) for t in range(TURNS)]
    assert all(r.prompt_tokens == r.prompt_len for r in records)  # the ids, as sent
    for c in range(CONVERSATIONS):
        turns = records[c * TURNS : (c + 1) * TURNS]
        for before, after in itertools.pairwise(turns):
            assert after.start_s >= after.arrival_s > before.end_s  # the answer, then think
            computed = before.prompt_len + before.output_tokens - 1
            assert after.prompt_len > computed + 1
            assert (after.cached_tokens or 0) >= computed // BLOCK * BLOCK, (before, after)

    (row,) = report["results"]  # no SLO: no sweep row
    block = row["conversation"]
    assert list(block["by_turn"]) == [str(t) for t in range(TURNS)]
    assert all(s["completed"] == CONVERSATIONS for s in block["by_turn"].values())
    assert block["overall"]["completed"] == CONVERSATIONS * TURNS
    assert block["by_turn"]["1"]["cache_hit_rate"] > 0
    sources = block["prompt_sources"]
    assert sources is not None and sum(sources.values()) == pytest.approx(1.0)

"""lm-evaluation-harness runs unchanged against the cluster (issue 20): its
``local-completions`` model (token ids, ``echo`` + ``logprobs`` for loglikelihoods) on two
local tasks, a multiple-choice one and a ``generate_until`` one, over JSON lines this test
writes (``dataset_path: json``; no hub access: ``HF_DATASETS_OFFLINE``).

Every request the harness sends is recorded with its answer. Each loglikelihood the
harness received must equal transformers' log-softmax over the same token ids it sent
(within 1e-4, fp32), and the task's accuracy must be the one those reference values give;
each generation must be transformers' greedy continuation of the ids sent, cut at the
stop string. (lm-eval's own Hugging Face backend is not compared item by item: it
tokenizes the context differently.)
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest

from kvserve.cluster.launch import Cluster
from tests.integration.reference import hf_greedy, hf_logprobs
from tests.tiny_cluster import MODEL_NAME

ATOL = 1e-4
QUESTIONS = [
    ("The sky is", [" blue", " green", " loud"], 0),
    ("Two plus two equals", [" four", " five"], 0),
    ("Water boils at one hundred degrees", [" Celsius", " Fahrenheit", " Kelvin"], 0),
    ("The capital of France is", [" Paris", " Rome"], 0),
    ("A week has seven", [" days", " hours", " years"], 0),
]
PROMPTS = [("Q: Name a color.\nA:", "red"), ("Q: Count to three.\nA:", "1 2 3")]

MC_TASK = """task: kvs_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""
GEN_TASK = """task: kvs_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 6
  do_sample: false
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
"""


@pytest.fixture(scope="module")
def cluster(eval_cluster: Cluster) -> Cluster:
    """The cluster shared with the other evaluation-API tests (``conftest.py``)."""
    return eval_cluster


def write_tasks(root: Path) -> None:
    with (root / "mc.jsonl").open("w") as f:
        for question, choices, answer in QUESTIONS:
            f.write(json.dumps({"question": question, "choices": choices, "answer": answer}) + "\n")
    with (root / "gen.jsonl").open("w") as f:
        for prompt, target in PROMPTS:
            f.write(json.dumps({"question": prompt, "answer": target}) + "\n")
    (root / "kvs_mc.yaml").write_text(MC_TASK.format(data=root / "mc.jsonl"))
    (root / "kvs_gen.yaml").write_text(GEN_TASK.format(data=root / "gen.jsonl"))


def run_harness(
    cluster: Cluster, model_dir: Path, tasks: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[dict[str, Any], list[tuple[dict[str, Any], dict[str, Any]]]]:
    """lm-eval's results and every (payload, answer) it exchanged with the router."""
    for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(name, "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tasks / "datasets-cache"))
    import requests
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    calls: list[tuple[dict[str, Any], dict[str, Any]]] = []
    post = requests.post

    def recording_post(url: str, json: dict[str, Any], **kwargs: Any) -> Any:
        response = post(url, json=json, **kwargs)
        calls.append((json, response.json()))
        return response

    monkeypatch.setattr(requests, "post", recording_post)
    args = {
        "model": MODEL_NAME,
        "base_url": cluster.router_url + "/v1/completions",
        "tokenizer_backend": "huggingface",
        "tokenizer": str(model_dir),
        "num_concurrent": 1,
        "max_retries": 1,
        "max_length": 512,
    }
    results = simple_evaluate(
        model="local-completions",
        model_args=args,
        tasks=["kvs_mc", "kvs_gen"],
        # only this test's tasks: indexing lm-eval's thousands of own tasks took 6.6 s of CPU
        task_manager=TaskManager(include_path=str(tasks), include_defaults=False),
        num_fewshot=0,
    )
    assert results is not None
    return results["results"], calls


def test_lm_eval_scores_match_the_reference(
    cluster: Cluster, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_tasks(tmp_path)
    results, calls = run_harness(cluster, tiny_model_dir, tmp_path, monkeypatch)
    scored = [(p, a) for p, a in calls if p.get("echo")]
    generated = [(p, a) for p, a in calls if not p.get("echo")]
    assert len(scored) == sum(len(c) for _, c, _ in QUESTIONS)
    assert len(generated) == len(PROMPTS)
    # every loglikelihood equals the reference over the ids the harness sent
    sums: dict[tuple[int, ...], float] = {}
    for payload, answer in scored:
        assert (payload["max_tokens"], payload["logprobs"], payload["temperature"]) == (1, 1, 0)
        (ids,) = payload["prompt"]
        (choice,) = answer["choices"]
        got = choice["logprobs"]["token_logprobs"]
        assert len(got) == len(ids) + 1 and got[0] is None
        ref = hf_logprobs(tiny_model_dir, ids)
        for i in range(1, len(ids)):
            assert math.isclose(got[i], float(ref[i - 1, ids[i]]), abs_tol=ATOL)
        sums[tuple(ids)] = sum(float(ref[i - 1, ids[i]]) for i in range(1, len(ids)))
    # the accuracy those reference values give: per question, the best-scoring choice's
    # continuation (the harness sums the continuation's logprobs; contexts are equal)
    correct = 0
    for question, choices, answer_index in QUESTIONS:
        mine = [(ids, total) for ids, total in sums.items() if _is_question(ids, question)]
        assert len(mine) == len(choices)
        best = max(mine, key=lambda item: item[1])
        correct += _choice_of(best[0], choices) == answer_index
    assert results["kvs_mc"]["acc,none"] == pytest.approx(correct / len(QUESTIONS))
    # generations: transformers' greedy continuation of the same ids, cut at the stop
    for payload, answer in generated:
        (ids,) = payload["prompt"]
        (choice,) = answer["choices"]
        want = hf_greedy(tiny_model_dir, ids, payload["max_tokens"])
        assert choice["text"] == _cut(_decode(tiny_model_dir, want), payload["stop"])
    assert "exact_match,none" in results["kvs_gen"]


def _decode(model_dir: Path, ids: list[int]) -> str:
    from transformers import AutoTokenizer

    return str(AutoTokenizer.from_pretrained(str(model_dir)).decode(ids))


def _cut(text: str, stops: list[str]) -> str:
    for stop in stops:
        if stop in text:
            text = text[: text.index(stop)]
    return text


def _is_question(ids: tuple[int, ...], question: str) -> bool:
    return _text_of(ids).startswith(question)


def _choice_of(ids: tuple[int, ...], choices: list[str]) -> int:
    text = _text_of(ids)
    return next(i for i, c in enumerate(choices) if text.endswith(c))


_TOKENIZER: dict[str, Any] = {}


def _text_of(ids: tuple[int, ...]) -> str:
    return str(_TOKENIZER["tok"].decode(list(ids)))


@pytest.fixture(autouse=True)
def _tokenizer(tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    _TOKENIZER["tok"] = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

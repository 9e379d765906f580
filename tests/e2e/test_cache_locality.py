"""Placement by cache locality, on real processes (issue 19): Redis, mooncake_master, the
router and two mixed workers on the tiny model, talked to with the official ``openai``
client.

- the workers publish KV events and the router's index follows them: a conversation's
  later turns (each turn's prompt = the history, the model's answer included, + a new
  message) go to the worker that holds the earlier turns locally, and take them from its
  local cache: ``usage.prompt_tokens_details.cached_tokens`` covers the history up to the
  answer's last computed token (the answer's KV was cached too), ``/v1/cache/stats`` counts
  them as local tokens on that worker, and the index predicted them exactly;
- the answers' KV reached the shared pool as well, so any worker could take the history
  from there (a pool lookup of the whole history, answers included, finds it);
- an unrelated burst of concurrent requests still spreads over both workers.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest

from kvserve.cluster.launch import Cluster
from proto.registry import connect, list_workers
from router.placement.pool_lookup import PoolLookup
from tests.integration.reference import hf_greedy
from tests.tiny_cluster import BLOCK, MODEL_NAME, cluster_client, prompt_of, tiny_cluster_spec

FIRST = 200  # tokens of the conversation's first message
MESSAGE = 24  # tokens of each later user message
ANSWER = 24  # tokens of each answer
TURNS = 3
BURST = 12


@pytest.fixture(scope="module")
def cluster(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    spec = tiny_cluster_spec(
        tiny_model_dir,
        tmp_path_factory.mktemp("cluster"),
        prefill=0,
        decode=0,
        mixed=2,
        policy="cache_aware",
    )
    with Cluster(spec) as started:
        yield started


def cache_stats(cluster: Cluster) -> dict[str, Any]:
    with urllib.request.urlopen(cluster.router_url + "/v1/cache/stats", timeout=10) as r:
        workers: dict[str, Any] = json.load(r)["since_start"]["workers"]
    return workers


def served_by(before: dict[str, Any], after: dict[str, Any]) -> str:
    """The one worker whose prefill count grew between the two stats."""
    grew = [w for w in after if after[w]["requests"] > before.get(w, {"requests": 0})["requests"]]
    assert len(grew) == 1, (before, after)
    return grew[0]


def wait_indexed(cluster: Cluster, worker: str, blocks: int) -> None:
    """Until the router's index says ``worker`` holds at least ``blocks`` blocks (the
    events of the last request's steps were published and read: a few hundred ms)."""
    for _ in range(100):
        with urllib.request.urlopen(cluster.router_url + "/metrics", timeout=10) as r:
            text = r.read().decode()
        line = f'kvserve:prefix_index_blocks{{worker="{worker}"}} '
        found = [float(x.split()[-1]) for x in text.splitlines() if x.startswith(line)]
        if found and found[0] >= blocks:
            return
        time.sleep(0.1)
    raise AssertionError(f"the index never showed {blocks} blocks on {worker}")


def test_a_conversation_stays_where_its_turns_are_cached(
    cluster: Cluster, tiny_model_dir: Path
) -> None:
    client = cluster_client(cluster)
    history = prompt_of(FIRST, 11)
    where: list[str] = []
    for turn in range(TURNS):
        before = cache_stats(cluster)
        reply = client.completions.create(
            model=MODEL_NAME,
            prompt=history,
            max_tokens=ANSWER,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        after = cache_stats(cluster)
        worker = served_by(before, after)
        where.append(worker)
        cached = reply.usage.prompt_tokens_details.cached_tokens or 0  # type: ignore[union-attr]
        if turn:  # the history up to the answer's last computed token: its KV included
            expected = (len(history) - MESSAGE - 1) // BLOCK * BLOCK
            assert cached >= expected, (turn, cached, expected)
            assert worker == where[0], (turn, where)  # the worker holding the history
            grew = after[worker]["local_tokens"] - before[worker]["local_tokens"]
            assert grew == cached  # local, not from the pool
            prediction = after[worker]["local_prediction"]
            assert prediction["requests"] > before[worker]["local_prediction"]["requests"]
            assert prediction["exact_rate"] == 1.0
        answer = hf_greedy(tiny_model_dir, history, ANSWER)
        assert reply.choices[0].text == client_decode(tiny_model_dir, answer)
        history = history + answer
        wait_indexed(cluster, worker, (len(history) - 1) // BLOCK)
        history = history + prompt_of(MESSAGE, 100 + turn)
    assert where == [where[0]] * TURNS
    assert pooled(cluster, history[:-MESSAGE]) >= (len(history) - MESSAGE - 1) // BLOCK * BLOCK


def client_decode(model_dir: Path, token_ids: list[int]) -> str:
    from transformers import AutoTokenizer

    return str(AutoTokenizer.from_pretrained(str(model_dir)).decode(token_ids))


def pooled(cluster: Cluster, prompt: list[int]) -> int:
    """Leading tokens of ``prompt`` the shared pool holds, asked as the router asks."""
    config = cluster.cluster_config
    registry = connect(config)
    try:
        record = list_workers(registry, config.keys)[0]
    finally:
        registry.close()

    async def ask() -> int:
        lookup = PoolLookup(cluster.spec.pool_config("router"), config)
        lookup.start()
        assert await lookup.wait_attempted(60)
        try:
            return await lookup.pooled_tokens(prompt, record)
        finally:
            await lookup.close()

    return asyncio.run(ask())


def test_an_unrelated_burst_spreads_over_the_workers(cluster: Cluster) -> None:
    client = cluster_client(cluster)
    before = cache_stats(cluster)

    def one(seed: int) -> openai.types.Completion:
        return client.completions.create(
            model=MODEL_NAME, prompt=prompt_of(160, 1000 + seed), max_tokens=8, temperature=0
        )

    with ThreadPoolExecutor(BURST) as pool:
        replies = list(pool.map(one, range(BURST)))
    assert all(r.usage is not None and r.usage.completion_tokens > 0 for r in replies)
    after = cache_stats(cluster)
    counts = {w: after[w]["requests"] - before.get(w, {"requests": 0})["requests"] for w in after}
    assert sum(counts.values()) == BURST
    assert min(counts.values()) >= BURST // 4, counts

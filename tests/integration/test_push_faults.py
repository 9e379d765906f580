"""Direct push through a whole cluster (1 prefill + 2 decode workers on the tiny model, real
Redis and mooncake_master, real gRPC, the router's default ``--kv-handoff push``), talked
to with the official ``openai`` client: pushed prompts decode exactly as transformers does,
and a decode worker that dies under a push costs the request nothing but a detour: it
completes on the other decode worker, exactly, and no live worker holds a page afterwards.
The workers move their KV in place whatever ``KVSERVE_KV_STAGING`` says (a staged cache
takes no push)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from kvpool.config import PoolConfig
from kvserve.cluster import faults
from kvserve.cluster.launch import Cluster
from tests.integration.pool_member import listening
from tests.integration.reference import hf_greedy
from tests.tiny_cluster import MODEL_NAME, cluster_client, prompt_of, tiny_cluster_spec

pytestmark = pytest.mark.kv_path

HANDOFFS = "kvserve:kv_handoffs_total"
IDS = {"return_token_ids": True, "ignore_eos": True}
IN_PLACE = PoolConfig(pool_segment_mib=64, pool_local_buffer_mib=16, kv_staging="never")


@pytest.fixture(scope="module")
def cluster(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    spec = tiny_cluster_spec(
        tiny_model_dir, tmp_path_factory.mktemp("push"), decode=2, policy="round_robin",
        pool=IN_PLACE,
    )  # fmt: skip
    with Cluster(spec).start() as running:
        yield running


@pytest.fixture(scope="module")
def client(cluster: Cluster) -> openai.OpenAI:
    return cluster_client(cluster)


def token_ids(client: openai.OpenAI, prompt: list[int], n: int) -> list[int]:
    (choice,) = client.completions.create(
        prompt=prompt, model=MODEL_NAME, max_tokens=n, temperature=0, extra_body=IDS
    ).choices
    ids: Any = (choice.model_extra or {})["token_ids"]
    return list(ids)


def test_pushed_prompts_decode_exactly(
    client: openai.OpenAI, cluster: Cluster, tiny_model_dir: Path
) -> None:
    """Also: the prefill worker's push engine (started by its first push) listens on the
    worker's pool address only, like its pool client (:mod:`kvpool.confine`)."""
    pid = cluster.process("prefill-0").pid
    assert pid is not None
    before = listening(pid)
    pushed = faults.router_metric(cluster, HANDOFFS, path="push")
    for length, seed in ((9, 1), (48, 2), (301, 3)):  # partial only, aligned, several chunks
        prompt = prompt_of(length, seed)
        assert token_ids(client, prompt, 8) == hf_greedy(tiny_model_dir, prompt, 8)
    assert faults.router_metric(cluster, HANDOFFS, path="push") == pushed + 3
    assert faults.wait_idle(cluster) == dict.fromkeys(cluster.worker_names, 0)
    after = listening(pid)
    assert len(after) > len(before), "the push engine opens listeners of its own"
    assert set(after) <= {"127.0.0.1", "::ffff:127.0.0.1"}, after


def reserving_decoder(cluster: Cluster, timeout: float = 30.0) -> str:
    """The decode worker that holds a reservation, once one does."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name in cluster.worker_names:
            if name.startswith("decode") and faults.load_of(cluster, name).reserved:
                return name
        time.sleep(0.01)
    raise AssertionError("no decode worker reserved pages")


def test_decode_worker_killed_under_a_push_completes_elsewhere(
    client: openai.OpenAI, cluster: Cluster, tiny_model_dir: Path
) -> None:
    """The prefill worker is held (SIGSTOP) as the request reaches it, so its push starts
    only after the decode worker holding the reservation was killed: the push fails, the
    prefill worker leaves the KV in the pool, the router's ``Generate`` to the dead worker
    fails and the request moves to the other decode worker, which takes the KV from the
    pool. Exact output; no live worker holds a page."""
    prompt = prompt_of(200, 7)
    expected = hf_greedy(tiny_model_dir, prompt, 8)
    failed = faults.router_metric(cluster, HANDOFFS, path="push_failed")
    got: list[list[int]] = []
    faults.freeze(cluster, "prefill-0")
    sender = threading.Thread(target=lambda: got.append(token_ids(client, prompt, 8)))
    try:
        sender.start()
        victim = reserving_decoder(cluster)
        faults.kill(cluster, victim)
    finally:
        faults.thaw(cluster, "prefill-0")
        sender.join(120)
    assert got == [expected]
    assert faults.router_metric(cluster, HANDOFFS, path="push_failed") == failed + 1
    alive = [n for n in cluster.worker_names if n != victim]
    assert faults.wait_idle(cluster, alive) == dict.fromkeys(alive, 0)
    cluster.restart_workers([victim])
    assert faults.wait_routable(cluster)

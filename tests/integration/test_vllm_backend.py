"""vLLM as the engine behind kvserve's router and pool (``--engine vllm``), on vLLM's CPU
build, in one cluster (:mod:`tests.integration.vllm_cluster`): a vLLM prefill worker and a
vLLM decode worker behind the router, a worker of our own engine beside them, plain
vLLM's offline ``LLM`` on the same model for reference; the official ``openai`` client
through the router, gRPC straight to a worker where a test needs one.

- greedy tokens through the cluster, streamed and not, equal plain vLLM's, for 20 prompts
  with and without a partial last block;
- the decode worker takes a prompt the prefill worker computed from the pool, its partial
  last block included: no prompt token recomputed there, the pool's tokens counted;
- the router's direct push, offered by default, falls back to the pool (a vLLM decode
  worker offers no target);
- a prefix a vLLM worker wrote is a pool hit on another vLLM worker and on our engine's
  (whose tokens equal transformers': vLLM's bytes are the KV our engine computes), and one
  our engine wrote is a hit on a vLLM worker with the tokens vLLM computes alone: one wire
  layout, one namespace;
- a block whose bytes were altered in the pool fails its digest: counted, removed,
  recomputed, the output unchanged; a missing block is a miss, recomputed, unchanged;
- a vLLM worker's prefix cache reaches the KV event stream under our block names;
- an unauthenticated call to a vLLM-backed worker is refused;
- a prefill worker whose pool master does not answer exits at start, before vLLM loads
  its model (:func:`kvpool.store.check_master`), never registered;
- the GPU check's vLLM check (``kvserve.gpucheck.vllm_path``) passes on this cluster;
- once every request is done, no worker holds a page.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import openai
import pytest

from kvpool.net import free_local_ports
from kvserve.cluster import faults
from kvserve.cluster.plan import worker_plan
from kvserve.cluster.processes import ManagedProcess
from kvserve.gpucheck.vllm_path import check_cluster
from proto import worker_pb2 as pb
from proto.channels import sync_channel
from proto.grpc_auth import ROUTER
from proto.registry import ClusterConfig
from proto.worker_pb2_grpc import WorkerStub
from tests.integration.reference import hf_greedy
from tests.integration.test_faults import registered
from tests.integration.vllm_cluster import (
    OURS,
    Setup,
    chain,
    generate,
    in_pool,
    load,
    prefill,
    running,
    stored_by,
)
from tests.tiny_cluster import MODEL_NAME, VLLM_BLOCK, cluster_client, prompt_of

pytestmark = pytest.mark.vllm

LENGTHS = (5, 31, 32, 33, 64, 70, 96, 100, 127, 150, 3, 17, 40, 63, 65, 90, 128, 129, 160, 200)
PROMPTS = [prompt_of(n, 500 + i) for i, n in enumerate(LENGTHS)]
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def setup(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    with running(tiny_model_dir, tmp_path_factory.mktemp("vllm"), PROMPTS, MAX_TOKENS) as started:
        yield started


def tokens_of(client: openai.OpenAI, prompt: list[int], stream: bool) -> list[int]:
    kwargs = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}
    body = {"extra_body": {"return_token_ids": True}}
    if not stream:
        out = client.completions.create(**kwargs, **body)  # type: ignore[call-overload]
        return list(out.choices[0].token_ids)
    tokens: list[int] = []
    for chunk in client.completions.create(**kwargs, **body, stream=True):  # type: ignore[call-overload]
        if chunk.choices:
            tokens += getattr(chunk.choices[0], "token_ids", None) or []
    return tokens


def test_greedy_tokens_equal_plain_vllms(setup: Setup) -> None:
    ours = cluster_client(setup.cluster)
    for prompt, want in zip(PROMPTS, setup.reference, strict=True):
        assert len(want) == MAX_TOKENS
        assert tokens_of(ours, prompt, stream=False) == want, len(prompt)
        assert tokens_of(ours, prompt, stream=True) == want, len(prompt)


def test_the_decode_worker_takes_the_whole_prompt_from_the_pool(setup: Setup) -> None:
    cluster, prompt = setup.cluster, prompt_of(100, 77)  # 3 full blocks, 4 tokens more
    before, prefill_before = load(setup, "decode-0"), load(setup, "prefill-0")
    out = cluster_client(cluster).completions.create(
        model=MODEL_NAME, prompt=prompt, max_tokens=4, temperature=0
    )
    assert out.choices[0].text
    after, prefilled = load(setup, "decode-0"), load(setup, "prefill-0")
    assert after.prompt_tokens_pool - before.prompt_tokens_pool == len(prompt)
    assert after.prompt_tokens_computed == before.prompt_tokens_computed
    assert after.prompt_tokens_local == before.prompt_tokens_local
    assert after.kv_bytes_read > before.kv_bytes_read
    assert prefilled.prompt_tokens_computed - prefill_before.prompt_tokens_computed == 100
    assert prefilled.kv_bytes_written > prefill_before.kv_bytes_written
    assert after.pool_checksum_failures == after.pool_forged_blocks == 0


def test_the_push_falls_back_to_the_pool(setup: Setup) -> None:
    handed = faults.router_metric(setup.cluster, "kvserve:kv_handoffs_total", path="pool")
    out = cluster_client(setup.cluster).completions.create(
        model=MODEL_NAME, prompt=prompt_of(70, 78), max_tokens=3, temperature=0
    )
    assert out.choices[0].finish_reason in ("length", "stop")
    after = faults.router_metric(setup.cluster, "kvserve:kv_handoffs_total", path="pool")
    assert after == handed + 1


def test_a_prefix_vllm_wrote_is_a_hit_on_vllm_and_on_our_engine(
    setup: Setup, tiny_model_dir: Path
) -> None:
    prefix = prompt_of(96, 11)  # 3 full blocks
    prefill(setup, "prefill-0", [*prefix, 5, 6, 7])
    assert in_pool(setup, chain(setup, prefix)) == 3
    alone, fresh = generate(setup, "decode-0", [*prefix, 8, 9], 6, salt="alone")
    assert fresh.pool_tokens == 0  # another chain: none of it in the pool
    tokens, used = generate(setup, "decode-0", [*prefix, 8, 9], 6)
    assert used.pool_tokens == 96 and used.computed_tokens == 2
    assert tokens == alone
    ours, ours_used = generate(setup, OURS, [*prefix, 10, 11], 6)
    assert ours_used.pool_tokens == 96 and ours_used.computed_tokens == 2
    assert ours == hf_greedy(tiny_model_dir, [*prefix, 10, 11], 6)


def test_a_prefix_our_engine_wrote_is_a_hit_on_vllm(setup: Setup) -> None:
    prefix = prompt_of(64, 12)  # 2 full blocks
    alone, _ = generate(setup, "decode-0", [*prefix, 3], 6, salt="alone")
    generate(setup, OURS, [*prefix, 4], 4)
    assert in_pool(setup, chain(setup, prefix)) == 2
    tokens, used = generate(setup, "decode-0", [*prefix, 3], 6)
    assert used.pool_tokens == 64 and used.local_tokens == 0
    assert tokens == alone


def prefilled(setup: Setup, seed: int) -> tuple[list[int], list[int], list[int]]:
    """A 100-token prompt (3 full blocks) the prefill worker wrote to the pool, the tokens
    the decode worker computes for it alone (another salt: nothing from the pool), and its
    block names."""
    prompt = prompt_of(100, seed)
    expected, _ = generate(setup, "decode-0", prompt, 6, salt="alone")
    prefill(setup, "prefill-0", prompt)
    names = chain(setup, prompt)
    assert in_pool(setup, names) == 3
    return prompt, expected, names


def test_an_altered_block_is_counted_removed_and_recomputed(setup: Setup) -> None:
    prompt, expected, names = prefilled(setup, 13)
    key = f"{setup.keys.meta_key(names[1])}/2"  # block 1, layer 2
    (raw,) = setup.store.get_bytes([key])
    setup.store.remove([key])
    assert setup.store.put_bytes([key], [bytes(b ^ 0xFF for b in raw)]) == 0
    before = load(setup, "decode-0")
    tokens, used = generate(setup, "decode-0", prompt, 6)
    assert tokens == expected
    assert used.pool_tokens == VLLM_BLOCK  # block 0 only; blocks 1 and 2 recomputed
    after = load(setup, "decode-0")
    assert after.pool_checksum_failures == before.pool_checksum_failures + 1
    assert after.pool_healed_blocks == before.pool_healed_blocks + 1


def test_a_missing_block_is_a_miss_and_recomputed(setup: Setup) -> None:
    prompt, expected, names = prefilled(setup, 14)
    setup.store.remove([f"{setup.keys.meta_key(names[1])}/0"])  # block 1 loses a layer
    tokens, used = generate(setup, "decode-0", prompt, 6)
    assert tokens == expected
    assert used.pool_tokens == VLLM_BLOCK and used.computed_tokens == 100 - VLLM_BLOCK


def test_a_vllm_workers_cache_reaches_the_event_stream_under_our_names(setup: Setup) -> None:
    prompt = prompt_of(70, 15)  # 2 full blocks
    generate(setup, "decode-0", prompt, 4, salt="tenant-a")
    names = set(chain(setup, prompt, salt="tenant-a"))
    for _ in range(75):
        if names <= stored_by(setup, "decode-0"):
            break
        time.sleep(0.2)
    assert names <= stored_by(setup, "decode-0")
    assert not names & stored_by(setup, "prefill-0")


def test_an_unauthenticated_call_is_refused(setup: Setup) -> None:
    for name in setup.cluster.worker_names:
        with (
            sync_channel(setup.addresses[name], ClusterConfig(), identity=ROUTER) as channel,
            pytest.raises(grpc.RpcError) as refused,
        ):
            WorkerStub(channel).GetLoad(pb.LoadRequest(), timeout=10)
        assert refused.value.code() in (
            grpc.StatusCode.UNAUTHENTICATED,
            grpc.StatusCode.PERMISSION_DENIED,
        )
        assert load(setup, name).role in ("prefill", "decode")  # the right token passes


def test_the_gpu_checks_vllm_check_passes_here(setup: Setup) -> None:
    """What ``scripts/gpu_check.sh`` checks of the vLLM backend on a GPU (every prompt
    through the pool, nothing recomputed on the decode worker), on this CPU cluster."""
    figures = check_cluster(setup.cluster, MODEL_NAME, "decode-0", 4)
    assert figures["decode_computed_tokens"] == 0 and figures["answered"] == 3


def test_a_prefill_worker_whose_pool_master_is_down_exits_before_vllm_starts(
    setup: Setup, tmp_path: Path
) -> None:
    port, closed = free_local_ports(2)
    spec = setup.cluster.spec
    spec = dataclasses.replace(
        spec, worker_args=(*spec.worker_args, "--pool-master", f"127.0.0.1:{closed}")
    )
    plan = worker_plan(spec, "no-pool-0", "prefill", port, (), 1)
    worker = ManagedProcess("no-pool-0", plan.argv, tmp_path / "no-pool.log", dict(plan.env))
    worker.start()
    try:
        assert worker.wait(300) == 1
    finally:
        worker.stop(10.0)
    said = "the prefill role needs the KV pool, which vLLM could not join: nothing answers at"
    assert f"{said} 127.0.0.1:{closed}" in worker.log_tail()  # the check before vLLM starts
    assert "no-pool-0" not in registered(setup.cluster)


def test_no_page_is_held_once_every_request_is_done(setup: Setup) -> None:
    cluster = setup.cluster
    assert faults.wait_idle(cluster) == dict.fromkeys(cluster.worker_names, 0)

"""The cluster the vLLM backend's tests share (``tests/integration/test_vllm_backend.py``):
one vLLM prefill worker and one vLLM decode worker behind the router (``--engine vllm``,
eager, 32-token blocks, every request disaggregated), one worker of our own engine in the
same cluster (same Redis, pool, secret and block size: :data:`OURS`), and plain vLLM's
greedy tokens on the same model (:func:`reference_tokens`) computed beside its start; plus
what the tests do to them: gRPC calls straight to a worker, the pool's names and objects,
the cluster's KV event stream.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc

from kvpool.hashing import Namespace, PrefixHasher
from kvpool.keys import KeySpace, longest_prefix
from kvpool.net import free_local_ports
from kvpool.store import MooncakeStore
from kvserve.cluster.launch import Cluster
from kvserve.cluster.plan import worker_plan
from kvserve.cluster.processes import ManagedProcess
from kvserve.vllm_env import QUIET_ENV, installed
from proto import worker_pb2 as pb
from proto.channels import sync_channel
from proto.grpc_auth import MONITOR, ROUTER
from proto.kv_events import Stored
from proto.kv_stream import read_batches
from proto.prefill import prefill_answer
from proto.registry import connect
from proto.worker_pb2_grpc import WorkerStub
from tests.integration.worker_process import wait_serving
from tests.tiny_cluster import VLLM_BLOCK, vllm_cluster_spec
from workers.model.loader import model_fingerprint

OURS = "ours-0"
"""The worker of our own engine in the cluster."""


@dataclasses.dataclass
class Setup:
    """The running cluster, plain vLLM's greedy tokens of the prompts :func:`running` was
    given (``reference``, in their order), every worker's address, and a pool client with
    the cluster's keys and names."""

    cluster: Cluster
    reference: list[list[int]]
    addresses: dict[str, str]
    keys: KeySpace
    hasher: PrefixHasher
    store: MooncakeStore


@contextlib.contextmanager
def running(
    model: Path, log_dir: Path, prompts: list[list[int]], max_tokens: int
) -> Iterator[Setup]:
    """Start everything (the cluster, with vLLM's reference tokens of ``prompts`` computed
    beside its start, then our engine's worker); stop it all on exit."""
    spec = vllm_cluster_spec(model, log_dir / "cluster")
    with contextlib.ExitStack() as stack, ThreadPoolExecutor(1) as starter:
        started = starter.submit(Cluster(spec).start)
        stack.callback(lambda: started.result().stop() if started.exception() is None else None)
        reference = reference_tokens(model, prompts, max_tokens, log_dir)
        cluster = started.result()
        ours_spec = dataclasses.replace(cluster.spec, worker_engine="kvserve")
        (port,) = free_local_ports(1)
        plan = worker_plan(ours_spec, OURS, "mixed", port, (), 1)
        ours = ManagedProcess(OURS, plan.argv, log_dir / f"{OURS}.log", dict(plan.env))
        stack.callback(ours.stop, 10.0)
        ours.start()
        wait_serving(plan.address, ours, cluster.cluster_config, timeout=180)
        addresses = {n: cluster.plan_of(n).address for n in cluster.worker_names}
        addresses[OURS] = plan.address
        keyring = cluster.cluster_config.keyring
        name = f"{model.name}@{model_fingerprint(model)}"
        namespace = Namespace(name, "float32", VLLM_BLOCK, algorithm=keyring.algorithm)
        lookups = dataclasses.replace(cluster.spec.pool_config("router"), pool_segment_mib=0)
        store = MooncakeStore.connect(lookups)
        stack.callback(store.close)
        keys = KeySpace.of(namespace, 4, keyring.pool_block)
        hasher = PrefixHasher(namespace, keyring.prefix_root)
        yield Setup(cluster, reference, addresses, keys, hasher, store)


REFERENCE_ENV = {
    **QUIET_ENV,
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # vLLM's engine in the script's own process
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "OMP_NUM_THREADS": "1",
}


def reference_tokens(
    model: Path, prompts: list[list[int]], max_tokens: int, log_dir: Path
) -> list[list[int]]:
    """Each prompt's ``max_tokens`` greedy tokens from plain vLLM on ``model`` (eager, fp32,
    :data:`VLLM_BLOCK`-token blocks: ``tests/integration/vllm_reference.py`` with vLLM's
    Python), its log in ``log_dir``; RuntimeError with the log's end if it fails."""
    out, log = log_dir / "vllm-reference.json", log_dir / "vllm-reference.log"
    script = Path(__file__).with_name("vllm_reference.py")
    ask = {
        "prompts": prompts,
        "max_tokens": max_tokens,
        "block_size": VLLM_BLOCK,
        "max_model_len": 2048,
    }
    argv = [str(installed().python), str(script), str(model), str(out)]
    with log.open("w") as sink:
        done = subprocess.run(
            argv, input=json.dumps(ask), text=True, stdout=sink,
            stderr=subprocess.STDOUT, env={**os.environ, **REFERENCE_ENV}, timeout=600,
        )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(
            f"vLLM's reference failed ({done.returncode}):\n{log.read_text()[-3000:]}"
        )
    answer: list[list[int]] = json.loads(out.read_text())
    return answer


def _stub(setup: Setup, worker: str, identity: str) -> grpc.Channel:
    """A new channel to ``worker``. Its calls wait for it to be ready (``wait_for_ready``):
    a channel made right after another to the same address was closed may find their shared
    connection shutting down ("tcp handshaker shutdown", seen once in CI between a GetLoad
    and a Generate): such a connect failure is transient and the call must wait it out."""
    return sync_channel(setup.addresses[worker], setup.cluster.cluster_config, identity=identity)


def generate(
    setup: Setup, worker: str, prompt: list[int], n: int, salt: str = ""
) -> tuple[list[int], pb.PromptUsage]:
    """Greedy tokens of ``prompt`` on ``worker`` (``Generate`` from the prompt) and its
    prompt usage."""
    request = pb.GenerateRequest(
        request_id=uuid.uuid4().hex,
        prompt_token_ids=prompt,
        params=pb.SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True),
        cache_salt=salt,
    )
    tokens: list[int] = []
    usage = pb.PromptUsage()
    with _stub(setup, worker, ROUTER) as channel:
        for i, chunk in enumerate(
            WorkerStub(channel).Generate(request, timeout=120, wait_for_ready=True)
        ):
            if i == 0:
                usage = chunk.usage
            tokens += chunk.token_ids
    return tokens, usage


def prefill(setup: Setup, worker: str, prompt: list[int]) -> pb.PrefillReply:
    """``Prefill`` of ``prompt`` on ``worker`` (its KV written to the pool)."""
    request = pb.PrefillRequest(
        request_id=uuid.uuid4().hex,
        prompt_token_ids=prompt,
        params=pb.SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True),
    )
    with _stub(setup, worker, ROUTER) as channel:
        return prefill_answer(
            WorkerStub(channel).Prefill(request, timeout=120, wait_for_ready=True)
        )


def load(setup: Setup, worker: str) -> pb.LoadReport:
    with _stub(setup, worker, MONITOR) as channel:
        report: pb.LoadReport = WorkerStub(channel).GetLoad(
            pb.LoadRequest(), timeout=30, wait_for_ready=True
        )
        return report


def chain(setup: Setup, prompt: list[int], salt: str = "") -> list[int]:
    """Our names of ``prompt``'s full blocks under ``salt``."""
    full = len(prompt) // VLLM_BLOCK * VLLM_BLOCK
    return setup.hasher.chain(prompt[:full], VLLM_BLOCK, setup.hasher.root(salt))


def in_pool(setup: Setup, names: list[int], timeout: float = 15.0) -> int:
    """How many leading ``names`` the pool holds, once it holds them all (a step's commit
    lands a moment after its output, unless it hands off) or ``timeout`` passed."""
    deadline = time.monotonic() + timeout
    while (held := longest_prefix(setup.store, setup.keys, names)) < len(names):
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    return held


def stored_by(setup: Setup, worker: str) -> set[int]:
    """The block names ``worker`` has published as stored (the cluster's KV event stream)."""
    cluster = setup.cluster.cluster_config
    client = connect(cluster)
    try:
        reading = read_batches(client, cluster.keys, count=100_000)
    finally:
        client.close()
    assert not reading.rejected
    return {
        event.hash
        for _, batch in reading.batches
        if batch.worker_id == worker
        for event in batch.events
        if isinstance(event, Stored)
    }

"""The cluster the vLLM backend's tests share (``tests/integration/test_vllm_backend.py``):
one vLLM prefill worker and one vLLM decode worker behind the router (``--engine vllm``,
eager, 32-token blocks, every request disaggregated), one worker of our own engine in the
same cluster (same Redis, pool, secret and block size: :data:`OURS`), and plain ``vllm
serve`` of the same model started beside it; plus what the tests do to them: gRPC calls
straight to a worker, the pool's names and objects, the cluster's KV event stream.
"""

from __future__ import annotations

import contextlib
import dataclasses
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
from kvserve.bench.peer.launch import vllm_server
from kvserve.cluster.launch import Cluster
from kvserve.cluster.plan import worker_plan
from kvserve.cluster.processes import ManagedProcess
from kvserve.vllm_env import installed
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
    """The running cluster, ``vllm serve`` beside it (``reference``: its URL), every
    worker's address, and a pool client with the cluster's keys and names."""

    cluster: Cluster
    reference: str
    addresses: dict[str, str]
    keys: KeySpace
    hasher: PrefixHasher
    store: MooncakeStore


@contextlib.contextmanager
def running(model: Path, log_dir: Path) -> Iterator[Setup]:
    """Start everything (the cluster and ``vllm serve`` side by side, then our engine's
    worker); stop it all on exit."""
    spec = vllm_cluster_spec(model, log_dir / "cluster")
    extra = ("--enforce-eager", "--block-size", str(VLLM_BLOCK))
    unbound = {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}
    (log_dir / "vllm-serve").mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack, ThreadPoolExecutor(1) as starter:
        started = starter.submit(Cluster(spec).start)
        stack.callback(lambda: started.result().stop() if started.exception() is None else None)
        reference = stack.enter_context(
            vllm_server(
                installed(), model, log_dir / "vllm-serve", kvcache_gib=1, max_model_len=2048,
                startup_timeout_s=300, extra=extra, environment=unbound,
            )
        )  # fmt: skip
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

"""Decode memory pressure on a real cluster: requests wait for KV pages, none is refused.

One one-machine cluster (Redis, mooncake_master, router, 1 prefill + 1 decode worker on the
tiny model) whose workers have only :data:`PAGES` KV pages each. Prompts of :data:`LONG`
tokens are disaggregated (the decode worker reserves their pages before the prefill);
prompts of :data:`SHORT` tokens are prefilled by the decode worker itself (conditional
disaggregation). A reservation made directly on the decode worker (the "hog", as a request
whose prefill is slow would hold) keeps most pages taken while a burst arrives, so that
requests must wait whatever the machine's speed; it is released once the router reports
requests waiting. Every check is on outcomes (exact tokens, statuses, pages held once
idle), never on timings.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest

from kvserve.cluster import faults
from kvserve.cluster.launch import Cluster
from proto import worker_pb2 as pb
from proto.channels import sync_channel
from proto.grpc_auth import ROUTER
from proto.worker_pb2_grpc import WorkerStub
from tests.integration.test_disconnect import RawRequest, body
from tests.tiny_cluster import BLOCK, MODEL_NAME, cluster_client, prompt_of, tiny_cluster_spec

pytestmark = pytest.mark.kv_path

PAGES = 32
"""KV pages of each worker (of BLOCK tokens): far fewer than the burst's prompts need."""
THRESHOLD = 40
"""Prompts with at most this many uncached tokens are prefilled by the decode worker."""
LONG, SHORT, OUTPUT = 96, 32, 32
HOG_PAGES = PAGES - 5
"""Pages the hog holds in the burst test: the 5 left are fewer than a LONG prompt's 6, so
while it holds them the router can neither reserve a long prompt's pages nor have the decode
worker prefill it itself (:func:`router.placement.types.prefill_locally` wants the free
pages for the prompt): a long request waits for pages at the router whatever the machine's
speed. With 12 left (20 held), a loaded run placed the long prompts on the decode worker,
which queued them in its engine: nothing waited at the router and the test failed."""
WAITING = "kvserve:requests_waiting_for_kv"
WAIT_S = 60.0


@pytest.fixture(scope="module")
def cluster(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    spec = tiny_cluster_spec(
        tiny_model_dir,
        tmp_path_factory.mktemp("kv-pressure"),
        engine={"num_kv_blocks": PAGES},
        disagg_threshold_tokens=THRESHOLD,
    )
    with Cluster(spec).start() as running:
        yield running


@pytest.fixture(scope="module")
def client(cluster: Cluster) -> openai.OpenAI:
    return cluster_client(cluster)


@pytest.fixture(autouse=True)
def idle_after(cluster: Cluster) -> Iterator[None]:
    """Each test leaves no page held on any worker and nobody waiting at the router."""
    yield
    assert faults.wait_idle(cluster) == dict.fromkeys(cluster.worker_names, 0)
    assert waiting(cluster) == 0


def complete(client: openai.OpenAI, prompt: list[int], n: int, salt: str | None = None) -> str:
    """A greedy completion's text (``salt``: a cache salt, so it shares no cached prefix)."""
    extra: dict[str, object] = {"ignore_eos": True}
    if salt is not None:
        extra["cache_salt"] = salt
    out = client.completions.create(
        model=MODEL_NAME, prompt=prompt, max_tokens=n, temperature=0, extra_body=extra
    )
    return out.choices[0].text


class Hog:
    """A reservation of ``pages`` pages made directly on a decode worker (lease 120 s)."""

    def __init__(self, cluster: Cluster, pages: int, seed: int) -> None:
        address = cluster.plan_of("decode-0").address
        self.channel = sync_channel(address, cluster.cluster_config, identity=ROUTER)
        self.stub = WorkerStub(self.channel)
        self.request_id = f"hog-{seed}"
        request = pb.ReserveRequest(
            request_id=self.request_id,
            prompt_token_ids=prompt_of(pages * BLOCK, seed),
            max_tokens=1,
            lease_ms=120_000,
        )
        assert self.stub.Reserve(request, timeout=30).ok
        # the router places by load reports up to a heartbeat old: let it see the pages gone
        # (and the work before this test done), or it may still think the decode worker
        # could prefill a long prompt itself (router.placement.types.prefill_locally)
        time.sleep(2 * cluster.cluster_config.heartbeat_s + 0.5)

    def release(self) -> None:
        self.stub.Abort(pb.AbortRequest(request_id=self.request_id), timeout=30)
        self.channel.close()


def eventually(predicate: Callable[[], bool], unless: Callable[[], bool] = lambda: False) -> bool:
    """Wait (bounded) until ``predicate()``; False at once when ``unless()`` (e.g. every
    request already ended)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline and not unless():
        if predicate():
            return True
        time.sleep(0.05)
    return False


def waiting(cluster: Cluster) -> float:
    """Requests waiting for KV pages at the router now."""
    return faults.router_metric(cluster, WAITING)


def outcome(client: openai.OpenAI, prompt: list[int]) -> str | Exception:
    try:
        return complete(client, prompt, OUTPUT)
    except openai.APIError as exc:
        return exc


def test_a_burst_beyond_the_decode_cache_waits_and_completes_exactly(
    cluster: Cluster, client: openai.OpenAI
) -> None:
    """A burst whose reservations need several times the decode worker's pages, while most
    of them are held: every request (disaggregated or local) completes with exactly the
    tokens it gets alone, none is refused, and every page comes back."""
    prompts = [prompt_of(LONG, s) for s in range(1, 9)]  # 6 pages each to reserve
    prompts += [prompt_of(SHORT, s) for s in range(11, 15)]
    alone = [complete(client, p, OUTPUT, salt="alone") for p in prompts]
    waited = faults.router_metric(cluster, "kvserve:kv_wait_seconds_count")
    hog = Hog(cluster, HOG_PAGES, seed=99)
    with ThreadPoolExecutor(len(prompts)) as pool:
        futures = [pool.submit(outcome, client, p) for p in prompts]
        try:
            eventually(lambda: waiting(cluster) >= 1, lambda: all(f.done() for f in futures))
        finally:
            hog.release()
        results = [f.result() for f in futures]
    errors = [r for r in results if isinstance(r, Exception)]
    assert errors == []
    assert results == alone
    assert faults.router_metric(cluster, "kvserve:kv_wait_seconds_count") > waited


def test_a_request_that_can_never_fit_is_refused_at_once(client: openai.OpenAI) -> None:
    """More pages than a decode worker has, disaggregated or prefilled locally: 400 with
    the reason, nothing waits."""
    too_long = prompt_of(PAGES * BLOCK - 8, 70)  # fits the model, not the KV cache
    with pytest.raises(openai.BadRequestError) as disagg:
        complete(client, too_long, 16)
    assert "KV pages" in disagg.value.message
    with pytest.raises(openai.BadRequestError) as local:
        complete(client, prompt_of(SHORT, 71), PAGES * BLOCK)
    assert "KV pages" in local.value.message


def test_a_client_that_leaves_while_waiting_leaves_no_trace(
    cluster: Cluster, client: openai.OpenAI
) -> None:
    """Dropped while it waits for pages: it leaves the router's queue at once, holds
    nothing on any worker, and the request after it is served as usual."""
    hog = Hog(cluster, PAGES - 2, seed=98)
    try:
        victim = RawRequest(cluster.router_url, body(prompt_of(LONG, 72), OUTPUT, stream=True))
        assert eventually(lambda: waiting(cluster) == 1)
        victim.disconnect()
        assert eventually(lambda: waiting(cluster) == 0)
    finally:
        hog.release()
    prompt = prompt_of(LONG, 73)
    assert complete(client, prompt, 8) == complete(client, prompt, 8, salt="alone")

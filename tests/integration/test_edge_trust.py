"""What a web page or another key holder can do at the router's HTTP edge (issue 38,
findings 6 and 8), against the real router.

- A router without API keys, on stub workers (:mod:`tests.integration.router_harness`: the
  real app over uvicorn, a real Redis): a browser's cross-site form post (a JSON body sent
  as ``text/plain``, which a page may send without asking) and a page that rebinds its own
  name to ``127.0.0.1`` (its name in ``Host``) reach no worker.
- A real one-machine cluster (Redis, the router, one mixed worker on the tiny model) with
  two bare API keys and two keys of one named tenant: a bare key holder learns nothing of
  the other's prompt from ``cached_tokens``; the named tenant's keys share their cache.
  And a process of the same user cannot read the router's or the worker's environment
  (finding 4: they are non-dumpable, :mod:`kvserve.hardening`).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from kvpool.net import free_local_ports
from kvserve.cluster.health import http_ok
from kvserve.cluster.launch import Cluster
from tests.integration.router_harness import MODEL, Harness, StubWorker, running_redis
from tests.tiny_cluster import BLOCK, MODEL_NAME, prompt_of, tiny_cluster_spec

BODY = json.dumps({"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 2}).encode()


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path) -> Iterator[Harness]:
    stubs = [StubWorker("p1", "prefill"), StubWorker("d1", "decode")]
    with (
        running_redis(tmp_path_factory.mktemp("redis")) as url,
        Harness(url, default_model_dir, stubs) as h,
    ):
        yield h


def work_calls(harness: Harness) -> int:
    return sum(stub.work_calls() for stub in harness.stubs.values())


@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data", None]
)
def test_a_body_not_sent_as_json_is_not_read(harness: Harness, content_type: str | None) -> None:
    before = work_calls(harness)
    headers = {} if content_type is None else {"Content-Type": content_type}
    for path in ("/v1/completions", "/tokenize"):
        status, data = harness.get(path, BODY, headers)
        assert status == 415, (path, data)
        assert json.loads(data)["error"]["code"] == "unsupported_media_type"
    assert work_calls(harness) == before
    json_utf8 = {"Content-Type": "application/json; charset=utf-8"}
    ok, _ = harness.get("/v1/completions", BODY, json_utf8)
    assert ok == 200 and work_calls(harness) > before


def host_refusals(harness: Harness) -> float:
    _, text = harness.get("/metrics")
    found = re.search(rb"^kvserve:host_refusals_total (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def test_a_page_that_rebinds_its_name_to_loopback_drives_nothing(harness: Harness) -> None:
    before, refused = work_calls(harness), host_refusals(harness)
    for host in ("evil.example", "evil.example:8000", "127.0.0.1.evil.example", "[::2]:80", ""):
        for path, body in (("/v1/completions", BODY), ("/v1/models", None), ("/metrics", None)):
            headers = {"Host": host, "Content-Type": "application/json"}
            status, data = harness.get(path, body, headers)
            assert status == 400, (host, path, data)
            assert json.loads(data)["error"]["code"] == "invalid_host"
    assert work_calls(harness) == before
    assert host_refusals(harness) == refused + 15
    port = harness.port
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST", f"[::1]:{port}"):
        headers = {"Host": host, "Content-Type": "application/json"}
        assert harness.get("/v1/completions", BODY, headers)[0] == 200, host


KEYS = "sk-bare-a,sk-bare-b,team=sk-team-c,team=sk-team-d"


@pytest.fixture(scope="module")
def cluster(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    spec = tiny_cluster_spec(
        tiny_model_dir, tmp_path_factory.mktemp("cluster"), prefill=0, decode=0, mixed=1,
        use_pool=False, api_key=KEYS, engine={"attention": "torch"},
    )  # fmt: skip
    with Cluster(spec).start() as running:
        yield running


def cached(cluster: Cluster, key: str, prompt: list[int]) -> int:
    """The ``cached_tokens`` that ``key``'s holder is told for ``prompt``."""
    client = openai.OpenAI(
        base_url=cluster.router_url + "/v1", api_key=key, max_retries=0, timeout=120
    )
    out = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=1)
    details = out.usage.prompt_tokens_details if out.usage else None
    return (details.cached_tokens or 0) if details else 0


def test_a_bare_key_learns_nothing_of_another_keys_prompts(cluster: Cluster) -> None:
    prompt, whole = prompt_of(5 * BLOCK + 3, 401), 5 * BLOCK
    assert cached(cluster, "sk-bare-a", prompt) == 0
    assert cached(cluster, "sk-bare-a", prompt) == whole  # its own prefix: reused
    assert cached(cluster, "sk-bare-b", prompt) == 0  # another key's: not even its presence
    team = prompt_of(5 * BLOCK + 3, 402)
    assert cached(cluster, "sk-team-c", team) == 0
    assert cached(cluster, "sk-team-d", team) == whole  # one tenant name: shared on purpose
    assert cached(cluster, "sk-bare-a", team) == 0


CAPLESS = ["setpriv", "--bounding-set=-all", "--inh-caps=-all"] if os.geteuid() == 0 else []
"""Run as an unprivileged process of this user: root here gives up every capability."""


def test_another_process_of_the_user_cannot_read_the_routers_environment(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A second router of this cluster, started as the launcher starts one (its argv and
    environment: its grant, the API keys) but unprivileged, and a plain process beside it;
    a reader of the same user reads the plain process's environment, not the router's."""
    plan = cluster.plan_of("router")
    argv = list(plan.argv)
    (port,) = free_local_ports(1)
    argv[argv.index("--router-port") + 1] = str(port)
    argv[argv.index("--router-id") + 1] = "router-inspected"
    with (tmp_path / "router.log").open("wb") as log:
        router = subprocess.Popen(
            [*CAPLESS, *argv], env={**os.environ, **dict(plan.env)}, stdout=log, stderr=log
        )
    plain = subprocess.Popen([*CAPLESS, "sleep", "60"], env={"KVSERVE_API_KEY": "sk-plain"})
    try:
        deadline = time.monotonic() + 60
        while not http_ok(f"http://127.0.0.1:{port}/health"):
            assert router.poll() is None and time.monotonic() < deadline, "router never up"
            time.sleep(0.1)
        seen = subprocess.run([*CAPLESS, "cat", f"/proc/{plain.pid}/environ"], capture_output=True)
        assert seen.returncode == 0 and b"KVSERVE_API_KEY=sk-plain" in seen.stdout
        kept = subprocess.run([*CAPLESS, "cat", f"/proc/{router.pid}/environ"], capture_output=True)
        assert kept.returncode != 0 and b"KVSERVE" not in kept.stdout
        assert b"Permission denied" in kept.stderr, kept.stderr
    finally:
        for process in (router, plain):
            process.terminate()
            process.wait(30)

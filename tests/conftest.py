"""Shared fixtures: model directories made by the project itself (nothing from a hub)."""

from __future__ import annotations

import collections
import fcntl
import os
from pathlib import Path
from typing import Any

import pytest

import kvserve  # noqa: F401  (first: gRPC's fork support off before grpc loads)
from kvpool.net import PORTS_ENV
from tests.file_order import STORE, FileDurations, FilesAndGroups
from workers.model.prepare import make_tiny_model, prepare_default_model

PORT_SPAN_ENV = "KVSERVE_TEST_PORTS"
"""``LOW-HIGH``: the ports this pass of the suite may hand out (scripts/test.sh gives each
pass its own), split evenly among its xdist processes (:func:`pytest_configure`)."""
SHARED_MODELS_ENV = "KVSERVE_TEST_MODELS"
"""A folder the processes of one run of the suite share for the models its fixtures make
(scripts/test.sh gives one to both passes; removed after the run)."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        STORE, action="store_true", help="measure each file's seconds into tests/durations.json"
    )


def pytest_configure(config: pytest.Config) -> None:
    """Order the files longest first (:mod:`tests.file_order`). On an xdist process of a
    pass that has a port span, give this process its share of the span as
    :data:`kvpool.net.PORTS_ENV`, so processes running side by side never pick the same free
    port (outside that, ports are the OS's choice)."""
    config.pluginmanager.register(FileDurations(config.getoption(STORE)), "file-durations")
    span, worker = os.environ.get(PORT_SPAN_ENV, ""), os.environ.get("PYTEST_XDIST_WORKER", "")
    if not (span and worker):
        return
    low, high = (int(x) for x in span.split("-"))
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    share = (high - low) // count
    start = low + int(worker.removeprefix("gw")) * share
    os.environ[PORTS_ENV] = f"{start}-{start + share}"


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # before xdist's own answer
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile`` (scripts/test.sh) keeps the files that share a package's cluster
    on one process (:class:`tests.file_order.FilesAndGroups`); other modes are xdist's."""
    return FilesAndGroups(config, log) if config.getvalue("dist") == "loadfile" else None


UNIT_TESTS = Path(__file__).parent / "unit"
"""Where the unit tests live: pure logic, no server and no pool of their own."""


@pytest.hookimpl(tryfirst=True)  # before ``-m`` selects by markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test under :data:`UNIT_TESTS` ``unit``: scripts/test.sh runs them in its
    ``kv_path`` pass, whose staging mode is nothing to them, since that pass ends a minute
    before the other without them. And give every test an id of its own
    (:func:`_one_id_each`)."""
    for item in items:
        if item.path.is_relative_to(UNIT_TESTS):
            item.add_marker(pytest.mark.unit)
    _one_id_each(items)


def _one_id_each(items: list[pytest.Item]) -> None:
    """pytest 9.2 builds a test's id from its function's name and its ``parametrize`` call;
    schemathesis 4.32 names each API operation's test ``test[<METHOD> <path>]`` without such
    a call, so all the operations of one test shared an id, and pytest-xdist, which hands
    tests out by id, ran only the first of them. Such a test takes its name's bracket into
    its id. UsageError if two tests still share an id: they would run once between them."""
    count = collections.Counter(item.nodeid for item in items)
    for item in items:
        if count[item.nodeid] > 1 and isinstance(item, pytest.Function):
            prefix = f"{item.originalname}["
            if item.name.startswith(prefix) and item.name.endswith("]") and item._id.params is None:
                item._id = item._id.with_params(item.name.removeprefix(prefix)[:-1])
    shared = [i for i, n in collections.Counter(item.nodeid for item in items).items() if n > 1]
    if shared:
        raise pytest.UsageError(f"tests that share an id (xdist runs one of each): {shared}")


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """SmolLM2-135M-Instruct converted from the shipped GGUF (cached across runs)."""
    return prepare_default_model()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path) -> Path:
    """A 4-layer random Llama with GQA and SmolLM2's tokenizer. Made once per run of
    scripts/test.sh: in the folder it names in :data:`SHARED_MODELS_ENV`, by the first
    process to get there (the others wait on the lock and take it; about 9 s of CPU each
    process saves); in a temporary folder of this session otherwise."""
    shared = os.environ.get(SHARED_MODELS_ENV)
    folder = Path(shared) if shared else tmp_path_factory.mktemp("models")
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / "tiny-llama"
    with (folder / "tiny-llama.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (target / "config.json").is_file():
            make_tiny_model(target, seed=0, tokenizer_dir=default_model_dir)
    return target

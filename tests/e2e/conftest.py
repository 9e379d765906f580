"""The cluster that the tests of this folder that take ``eval_cluster`` share (the
evaluation-API tests, the status page's, the Redis logins' and the token replay's): a
prefill and a decode worker on the tiny model, every request disaggregated.
Package-scoped, so it starts once for all of them and stops after the last test of this
folder; under xdist the files that use it run on one process
(:data:`tests.file_order.ONE_PROCESS`), or each process would start its own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kvserve.cluster.launch import Cluster
from tests.file_order import EVAL_CLUSTER, ONE_PROCESS, file_of
from tests.tiny_cluster import tiny_cluster_spec


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Refuse a test that takes the shared cluster from a file that scripts/test.sh does
    not keep on the cluster's process (:data:`tests.file_order.ONE_PROCESS`)."""
    listed = ONE_PROCESS[EVAL_CLUSTER]
    for item in items:
        name = file_of(item.nodeid)
        if EVAL_CLUSTER in getattr(item, "fixturenames", ()) and name not in listed:
            raise pytest.UsageError(f"{name} takes {EVAL_CLUSTER}: list it in tests/file_order.py")


@pytest.fixture(scope="package")
def eval_cluster(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    with Cluster(tiny_cluster_spec(tiny_model_dir, tmp_path_factory.mktemp("eval"))) as up:
        yield up

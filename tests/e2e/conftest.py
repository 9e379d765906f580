"""The cluster that the evaluation-API tests and the status page's test share
(``test_lm_eval.py``, ``test_openai_eval_api.py`` and ``test_status_page.py``, next to each
other in the run): a prefill and a decode worker on the tiny model, every request
disaggregated. Package-scoped, so it starts once for all three and stops after the last
test of this folder."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kvserve.cluster.launch import Cluster
from tests.tiny_cluster import tiny_cluster_spec


@pytest.fixture(scope="package")
def eval_cluster(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    with Cluster(tiny_cluster_spec(tiny_model_dir, tmp_path_factory.mktemp("eval"))) as up:
        yield up

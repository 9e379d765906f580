"""One step of the connector's worker side (``vllm_backend.conn_worker.WorkerSide``) over
the real pool, writer and layer loads on the fake Mooncake binding and a staged cache, the
calls in vLLM's order (``begin``, ``start_loads``, per layer ``wait_layer`` and
``save_layer``, ``end_step``). What is checked: a step whose loads all arrived publishes
its writes; a step in which any block failed to arrive (an altered span, the loader
failing, no pool on the worker side) reports those pages as load errors and publishes
nothing it computed, since that was computed over pages that never arrived."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kvpool.config import PoolConfig
from kvpool.layer_load import LayerLoad
from kvpool.stream import StreamWriter, WriteIntent
from proto.registry import ClusterConfig
from tests.unit.test_landing import LAYOUT, NAMESPACE, Harness
from tests.unit.test_layer_load import staged_harness
from tests.unit.test_span_io import PutClient
from vllm_backend.conn_scheduler import StepPlan
from vllm_backend.conn_worker import WorkerSide
from vllm_backend.plans import LoadItem
from vllm_backend.spec import ConnectorSpec

LAYERS = [f"model.layers.{i}.attn" for i in range(LAYOUT.num_layers)]
WRITTEN = 77
"""The name of the block the step computes and writes."""


class MetaClient(PutClient):
    """The fake binding with every put the pool makes (spans and metas)."""

    def put_batch(self, keys: list[str], values: list[bytes]) -> int:
        self.objects.update(zip(keys, values, strict=True))
        return 0

    def close(self) -> int:
        return 0


@pytest.fixture
def h() -> Harness:
    harness = staged_harness()
    client = MetaClient()
    client.objects = harness.client.objects
    harness.pool.store._client = client
    harness.client = client
    return harness


@pytest.fixture
def side(h: Harness) -> Iterator[WorkerSide]:
    spec = ConnectorSpec(PoolConfig(), ClusterConfig(), NAMESPACE, LAYOUT.wire, "", "w")
    worker = WorkerSide(spec)
    worker.pool, worker.writer = h.pool, StreamWriter(h.pool)
    worker.layers = {name: i for i, name in enumerate(LAYERS)}
    yield worker
    worker.close()


def step(side: WorkerSide, h: Harness) -> set[int]:
    """One step that loads blocks 1 and 2 into pages 3 and 4 and writes block
    :data:`WRITTEN` from page 9; the load errors it reports."""
    loads = [LoadItem("q", "r", [1, 2], [3, 4], [], 0)]
    writes = [WriteIntent("r", [(WRITTEN, 9)], 2)]
    side.begin(StepPlan(loads, writes, wait_commit=True))
    side.start_loads()
    for name in LAYERS:
        side.wait_layer(name)
        side.save_layer(name)
    side.end_step()
    assert side.writer is not None
    side.writer.flush()
    return side.load_errors()


def published(h: Harness) -> bool:
    return h.pool.keys.meta_key(WRITTEN) in h.client.objects


def test_a_step_whose_loads_arrived_publishes_its_writes(h: Harness, side: WorkerSide) -> None:
    for name in (1, 2):
        h.block(h.pool.keys.meta_key(name))
    assert step(side, h) == set()
    assert published(h)


def test_an_altered_block_is_a_load_error_and_the_step_publishes_nothing(
    h: Harness, side: WorkerSide
) -> None:
    keys = [h.pool.keys.meta_key(name) for name in (1, 2)]
    for key in keys:
        h.block(key)
    bad = f"{keys[1]}/1"
    h.client.objects[bad] = bytes(b ^ 1 for b in h.client.objects[bad])
    assert step(side, h) == {4}
    assert not published(h)


def test_a_failing_loader_makes_every_page_an_error(
    h: Harness, side: WorkerSide, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in (1, 2):
        h.block(h.pool.keys.meta_key(name))
    real = LayerLoad.read_layer

    def failing(self: LayerLoad, layer: int, tails: bool = False) -> None:
        if layer == 1 and not tails:
            raise OSError("the transfer engine went away")
        real(self, layer, tails)

    monkeypatch.setattr(LayerLoad, "read_layer", failing)
    assert step(side, h) == {3, 4}  # block 1's layers 0 and 2 arrived: not enough
    assert not published(h)


def test_first_reads_that_fail_make_every_page_an_error(
    h: Harness, side: WorkerSide, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing(self: LayerLoad) -> None:
        raise OSError("the master went away")

    monkeypatch.setattr(LayerLoad, "read_metas", failing)
    assert step(side, h) == {3, 4}
    assert not published(h)

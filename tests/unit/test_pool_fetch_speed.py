"""The pool fetch speed placement uses (issue 19): measured from a worker's own landings
(bytes read over read time, per token of its KV layout), not a constant."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, cast

import pytest

from kvpool.layout import KVLayout, token_bytes
from proto.registry import WorkerRecord
from router.placement.live_worker import LiveWorker
from router.placement.policies import POOL_FETCH_S_PER_TOKEN, WorkerLoad

LAYOUT = KVLayout(num_layers=30, num_blocks=8, block_tokens=16, kv_heads=3, head_dim=64,
                  dtype="float32")  # fmt: skip
RECORD = WorkerRecord(
    worker_id="d1", address="127.0.0.1:1", role="decode", model="m", model_dir="/nowhere",
    contract=f"ns|{LAYOUT.wire}", block_tokens=16, num_layers=30, max_model_len=4096,
    started_at=1.0, heartbeat_at=1.0,
)  # fmt: skip


def test_token_bytes_is_one_tokens_kv_over_all_layers() -> None:
    assert token_bytes(LAYOUT.wire) == LAYOUT.num_layers * LAYOUT.span_bytes // 16
    assert token_bytes("L2xbt4xH1xD8xbfloat16") == 2 * 2 * 1 * 8 * 2


@pytest.mark.parametrize("wire", ["", "L2", "L2xbt4xH1xD8xint4", "L2xbt4xH1xD8xfloat32|x"])
def test_token_bytes_refuses_what_is_not_a_layout(wire: str) -> None:
    with pytest.raises(ValueError):
        token_bytes(wire)


def worker(load: dict[str, Any], contract: str = RECORD.contract) -> LiveWorker:
    return LiveWorker(replace(RECORD, contract=contract, load=load), cast(Any, None))


def test_the_fetch_speed_is_the_landings_bytes_per_token_over_their_time() -> None:
    per_token = token_bytes(LAYOUT.wire)
    load = {"kv_bytes_read": str(per_token * 50_000), "kv_read_seconds": 2.0}
    measured = worker(load).load()
    assert measured.pool_fetch_tokens_per_s == pytest.approx(25_000.0)
    assert measured.fetch_s_per_token == pytest.approx(1 / 25_000)


@pytest.mark.parametrize(
    ("load", "contract"),
    [
        ({}, RECORD.contract),  # nothing read yet
        ({"kv_bytes_read": "1000", "kv_read_seconds": 0.0}, RECORD.contract),
        ({"kv_bytes_read": "1000", "kv_read_seconds": 1.0}, "ns|not-a-layout"),
    ],
)
def test_without_a_measure_the_default_applies(load: dict[str, Any], contract: str) -> None:
    measured = worker(load, contract).load()
    assert measured.pool_fetch_tokens_per_s == 0.0
    assert measured.fetch_s_per_token == POOL_FETCH_S_PER_TOKEN
    assert WorkerLoad("w", "decode").fetch_s_per_token == POOL_FETCH_S_PER_TOKEN

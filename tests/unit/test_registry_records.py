"""Registry records are not believed blindly (issue 17): a value read from Redis becomes a
:class:`WorkerRecord` only with a MAC made with the cluster secret over its content and its
key, and only within the schema's types and bounds; the contract likewise. No Redis here:
the stored forms are built and opened directly (``test_registry_trust`` does it live)."""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

import pytest

from proto.record_store import (
    MAX_RECORD_BYTES,
    open_contract,
    open_record,
    seal_contract,
    seal_fields,
    seal_record,
)
from proto.records import FORGED, MALFORMED, RecordError, WorkerRecord
from proto.refusals import Rejection, RejectLog
from proto.registry import ClusterConfig, Keys
from proto.trust import new_secret

KEYS = ClusterConfig(cluster="trust", cluster_secret=new_secret()).keys
RECORD = WorkerRecord(
    worker_id="decode-0", address="127.0.0.1:50061", role="decode", model="tiny",
    model_dir="/models/tiny", contract="kvs1|tiny|float32|bt16|v1|L4",
    block_tokens=16, num_layers=4, max_model_len=2048, started_at=1.7e9, heartbeat_at=1.7e9,
    load={"role": "decode", "free_pages": 12, "queued_prefill_tokens": "40",
          "prefill_tokens_per_s": 812.5, "draining": False, "pool_connected": True},
)  # fmt: skip
NAME = KEYS.worker(RECORD.worker_id)


def fields(**changes: object) -> dict[str, Any]:
    return {**dataclasses.asdict(RECORD), **changes}


def refused(name: str, raw: str | bytes, keys: Keys = KEYS) -> str:
    """The reason ``raw`` under ``name`` is refused (fails when it is accepted)."""
    with pytest.raises(RecordError) as error:
        open_record(keys, name, raw)
    return error.value.reason


def test_a_sealed_record_opens_as_itself() -> None:
    assert open_record(KEYS, NAME, seal_record(KEYS, RECORD)) == RECORD
    assert open_record(KEYS, NAME, seal_record(KEYS, RECORD).encode()) == RECORD
    bracketed = dataclasses.replace(RECORD, address="[::1]:9", worker_id="w_[1]")
    assert open_record(KEYS, KEYS.worker("w_[1]"), seal_record(KEYS, bracketed)) == bracketed


def test_only_the_cluster_secret_makes_a_record() -> None:
    unsigned = RECORD.to_json()  # the pre-MAC form: any writer of Redis can make it
    other = ClusterConfig(cluster="trust", cluster_secret=new_secret()).keys
    no_secret = Keys("trust")
    assert refused(NAME, unsigned) == FORGED
    assert refused(NAME, seal_record(other, RECORD)) == FORGED
    assert refused(NAME, seal_record(no_secret, RECORD)) == FORGED
    assert refused(NAME, json.dumps({**fields(), "mac": "00" * 32})) == FORGED
    assert refused(NAME, json.dumps({**fields(), "mac": "not hex"})) == FORGED


def test_a_changed_field_breaks_the_mac() -> None:
    stored = json.loads(seal_record(KEYS, RECORD))
    for field, value in (("max_model_len", 1), ("address", "10.0.0.9:1"), ("model_dir", "/etc")):
        assert refused(NAME, json.dumps({**stored, field: value})) == FORGED
    load = {**stored["load"], "free_pages": 10**9}
    assert refused(NAME, json.dumps({**stored, "load": load})) == FORGED
    assert refused(NAME, json.dumps({**stored, "extra": 1})) == FORGED


def test_a_record_cannot_be_replayed_under_another_key() -> None:
    sealed = seal_record(KEYS, RECORD)
    assert refused(KEYS.worker("decode-1"), sealed) == FORGED
    elsewhere = dataclasses.replace(KEYS, cluster="other")
    assert refused(elsewhere.worker(RECORD.worker_id), sealed, elsewhere) == FORGED
    # sealed under a key that is not its worker id's: authentic, yet refused
    assert refused("trust:worker:x", seal_fields(KEYS, "trust:worker:x", fields())) == MALFORMED


BAD_FIELDS: list[dict[str, object]] = [
    {"worker_id": ""}, {"worker_id": "a b"}, {"worker_id": "a/b"}, {"worker_id": "a:b"},
    {"worker_id": "w" * 129}, {"worker_id": "wé"}, {"worker_id": 7},
    {"address": "nohost"}, {"address": "h:0"}, {"address": "h:65536"}, {"address": "h:http"},
    {"address": "h :1"}, {"address": "h:1\n"}, {"address": "a@b:1"}, {"address": ":80"},
    {"address": "h" * 300 + ":1"}, {"address": ["h", 1]},
    {"role": "boss"}, {"role": None},
    {"model": ""}, {"model": "m" * 257}, {"model": "a\nb"}, {"model": 3},
    {"model_dir": "d" * 4097}, {"model_dir": "/a\x00b"}, {"contract": "c" * 2049},
    {"block_tokens": 0}, {"block_tokens": 4097}, {"block_tokens": 16.0},
    {"num_layers": 0}, {"num_layers": 1025}, {"max_model_len": 0},
    {"max_model_len": (1 << 24) + 1}, {"max_model_len": 10**400},
    {"started_at": -1.0}, {"started_at": "now"}, {"heartbeat_at": 1e12},
    {"load": []}, {"load": {"free_pages": -1}}, {"load": {"free_pages": "lots"}},
    {"load": {"free_pages": 1e300}}, {"load": {"free_pages": True}},
    {"load": {"queued_prefill_tokens": "1" * 21}}, {"load": {"role": "boss"}},
    {"load": {"draining": "yes"}}, {"load": {"novel": {"nested": 1}}},
    {"load": {"novel": "x" * 257}}, {"load": {"bad key": 1}}, {"load": {"": 1}},
    {"load": {f"f{i}": 1 for i in range(65)}},
]  # fmt: skip


@pytest.mark.parametrize("change", BAD_FIELDS, ids=lambda c: json.dumps(c)[:40])
def test_an_authentic_record_out_of_bounds_is_refused(change: dict[str, object]) -> None:
    data = fields(**change)
    name = KEYS.worker(str(data["worker_id"]))  # its own key: only the schema refuses it
    with pytest.raises(RecordError) as error:
        open_record(KEYS, name, seal_fields(KEYS, name, data))
    assert error.value.reason == MALFORMED
    assert len(str(error.value)) < 300  # an attacker's huge value is not echoed whole


@pytest.mark.parametrize("change", BAD_FIELDS[:12], ids=lambda c: json.dumps(c)[:40])
def test_no_worker_record_holds_an_out_of_bounds_value(change: dict[str, object]) -> None:
    with pytest.raises(RecordError):
        WorkerRecord(**fields(**change))


def test_a_missing_field_is_refused_and_an_unknown_one_ignored() -> None:
    data = fields()
    del data["max_model_len"]
    assert refused(NAME, seal_fields(KEYS, NAME, data)) == MALFORMED
    newer = seal_fields(KEYS, NAME, fields(zone="eu-1", load={**RECORD.load, "novel": 3}))
    assert open_record(KEYS, NAME, newer).load["novel"] == 3


@pytest.mark.parametrize(
    "raw",
    [b"\xff\xfe", "not json", "[1, 2]", "null", "[" * 5000 + "]" * 5000,
     json.dumps(fields(model="m" * MAX_RECORD_BYTES))],
    ids=["binary", "text", "array", "null", "deep", "huge"],
)  # fmt: skip
def test_a_value_that_is_no_json_object_is_refused(raw: str | bytes) -> None:
    assert refused(NAME, raw) == MALFORMED


def test_nan_is_never_authentic() -> None:
    stored = json.loads(seal_record(KEYS, RECORD))
    assert refused(NAME, json.dumps({**stored, "started_at": float("nan")})) == FORGED


def test_the_contract_carries_its_mac() -> None:
    sealed = seal_contract(KEYS, RECORD.contract)
    assert open_contract(KEYS, sealed) == RECORD.contract
    other = ClusterConfig(cluster="trust", cluster_secret=new_secret()).keys
    elsewhere = dataclasses.replace(KEYS, cluster="other")
    forged = [seal_contract(other, RECORD.contract), sealed.replace("v1", "v2")]
    for raw, keys in [*((f, KEYS) for f in forged), (sealed, elsewhere)]:
        with pytest.raises(RecordError) as error:
            open_contract(keys, raw)
        assert error.value.reason == FORGED
    for raw in (RECORD.contract, json.dumps({**json.loads(sealed), "extra": 1})):
        with pytest.raises(RecordError) as error:
            open_contract(KEYS, raw)  # the pre-MAC plain text; a field too many
        assert error.value.reason == MALFORMED


def test_the_secret_stays_out_of_reprs() -> None:
    cluster = ClusterConfig(cluster_secret=new_secret())
    assert cluster.cluster_secret not in repr(cluster.keys)
    assert cluster.keys.record_key.hex() not in repr(cluster.keys)


def test_refusals_are_logged_at_most_once_an_interval(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    logger = logging.getLogger("test.rejects")
    rejects = RejectLog(logger, "registry value", interval_s=60.0, max_keys=2, clock=lambda: now[0])
    one = Rejection("trust:worker:x", FORGED, "record carries no MAC")
    many = [Rejection(f"trust:worker:{i}", MALFORMED, "bad") for i in range(5)]
    with caplog.at_level(logging.WARNING, logger="test.rejects"):
        rejects.note([one])
        rejects.note([one])
        assert len(caplog.records) == 1 and "trust:worker:x" in caplog.records[0].getMessage()
        now[0] = 61.0
        rejects.note([one])
        assert len(caplog.records) == 2
        rejects.note(many)  # one more slot: one line, then one line for the 4 others
        rejects.note(many)
        lines = [r.getMessage() for r in caplog.records[2:]]
        assert len(lines) == 2 and lines[1].startswith("4 more registry value refusals")

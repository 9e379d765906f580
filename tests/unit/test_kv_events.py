"""The KV event batch codec (issue 19): a batch decodes back to itself only with the
cluster's registry-record MAC over its body and its stream, and every field within bounds;
anything else is one :class:`BatchError` with a reason. No Redis here
(``tests/integration/test_kv_events_redis.py`` runs the stream for real)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from proto import records
from proto.kv_events import (
    HASH_LIMIT,
    MAX_EVENTS,
    MAX_SEQ,
    WORKER_ID,
    BatchError,
    EventBatch,
    Removed,
    Stored,
)
from proto.kv_stream import (
    MAX_BATCH_BYTES,
    OVERSIZE,
    decode_batch,
    encode_batch,
    seal_body,
    stream_name,
)
from proto.records import FORGED, MALFORMED, MAX_TIMESTAMP
from proto.registry import ClusterConfig, Keys
from proto.trust import new_secret

KEYS = ClusterConfig(cluster="events", cluster_secret=new_secret()).keys
TOP = HASH_LIMIT - 1
BATCH = EventBatch(
    worker_id="decode-0",
    incarnation=1.7e9 + 0.125,
    seq=12,
    events=(Stored(TOP, 1), Removed(0), Stored(5, TOP)),
)
SNAPSHOT = EventBatch("w_[1]", 0, MAX_SEQ, (Stored(1, 2),), snapshot=True, part=3, final=False)


def body(**changes: object) -> dict[str, Any]:
    """The body of :data:`BATCH` as JSON fields, with ``changes``."""
    return {**json.loads(encode_batch(KEYS, BATCH)[64:]), **changes}


def sealed(fields: object) -> bytes:
    """``fields`` as a body with a genuine MAC (so only the schema can refuse it)."""
    return seal_body(KEYS, json.dumps(fields).encode())


def refused(raw: bytes | str, keys: Keys = KEYS) -> tuple[str, str]:
    """(reason, message) of refusing ``raw`` (fails when it is accepted)."""
    with pytest.raises(BatchError) as error:
        decode_batch(keys, raw)
    assert isinstance(error.value, records.RecordError)
    return error.value.reason, str(error.value)


def test_batches_decode_back_to_themselves() -> None:
    for batch in (BATCH, SNAPSHOT, EventBatch("w", 3, 0)):
        wire = encode_batch(KEYS, batch)
        assert decode_batch(KEYS, wire) == batch
        assert decode_batch(KEYS, wire.decode()) == batch
    full = EventBatch("w", 1.0, 1, tuple(Stored(TOP - i, TOP) for i in range(MAX_EVENTS)))
    wire = encode_batch(KEYS, full)
    assert len(wire) <= MAX_BATCH_BYTES
    assert decode_batch(KEYS, wire) == full


def test_the_wire_form_is_mac_then_compact_json() -> None:
    wire = encode_batch(KEYS, BATCH)
    assert wire[:64].decode() == wire[:64].decode().lower() and len(wire[:64]) == 64
    assert json.loads(wire[64:]) == {
        "v": 1, "worker": "decode-0", "incarnation": 1.7e9 + 0.125, "seq": 12,
        "snapshot": False, "part": 0, "final": True,
        "events": [["f" * 64, "1"], ["0"], ["5", "f" * 64]],
    }  # fmt: skip
    assert b" " not in wire
    assert stream_name(KEYS) == "events:kv-events"


def test_only_the_cluster_key_makes_a_batch() -> None:
    wire = encode_batch(KEYS, BATCH)
    other_secret = ClusterConfig(cluster="events", cluster_secret=new_secret()).keys
    assert refused(wire, other_secret)[0] == FORGED
    assert refused(wire, Keys("events"))[0] == FORGED  # no secret
    assert refused(encode_batch(Keys("events"), BATCH))[0] == FORGED
    other_cluster = dataclasses.replace(KEYS, cluster="other")  # same key, other stream
    assert refused(wire, other_cluster)[0] == FORGED
    assert refused(wire[64:])[0] == FORGED  # no MAC at all
    assert refused(wire[:64].upper() + wire[64:])[0] == FORGED
    assert refused(b"0" * 64 + wire[64:])[0] == FORGED
    assert refused(b"")[0] == FORGED


def test_a_changed_byte_breaks_the_mac() -> None:
    wire = encode_batch(KEYS, BATCH)
    for i in (0, 63, 64, 100, len(wire) - 1):
        changed = wire[:i] + bytes([wire[i] ^ 1]) + wire[i + 1 :]
        assert refused(changed)[0] == FORGED
    assert refused(wire + b" ")[0] == FORGED
    assert refused(wire.replace(b'"seq":12', b'"seq":13'))[0] == FORGED
    assert refused(wire.decode() + "\u00e9")[0] == FORGED  # not ASCII


def test_oversize_values_are_refused_unread() -> None:
    huge = sealed({"pad": "x" * MAX_BATCH_BYTES})
    assert refused(huge)[0] == OVERSIZE
    assert refused(huge.decode())[0] == OVERSIZE
    assert refused(b"x" * (MAX_BATCH_BYTES + 1))[0] == OVERSIZE


def test_more_events_than_the_cap_are_refused() -> None:
    events = [["1", "2"]] * (MAX_EVENTS + 1)
    assert refused(sealed(body(events=events)))[0] == MALFORMED
    too_many = tuple(Stored(1, 2) for _ in range(MAX_EVENTS + 1))
    with pytest.raises(BatchError, match="events"):
        EventBatch("w", 1.0, 0, too_many)


def test_bodies_that_are_not_batch_json_are_refused() -> None:
    for raw in (b"not json", b"[1, 2]", b'"text"', b"{}", b'{"v":1'):
        assert refused(seal_body(KEYS, raw))[0] == MALFORMED
    for constant in (b"NaN", b"Infinity", b"-Infinity"):
        raw = json.dumps(body(incarnation="@")).encode().replace(b'"@"', constant)
        assert json.loads(raw)["incarnation"] != 1.0  # what Python's JSON would accept
        assert refused(seal_body(KEYS, raw))[0] == MALFORMED
    for name in ("v", "worker", "events", "final"):
        fields = body()
        del fields[name]
        assert refused(sealed(fields))[0] == MALFORMED
    assert refused(sealed(body(extra=1)))[0] == MALFORMED


BAD_FIELDS: list[dict[str, object]] = [
    {"v": 2}, {"v": True}, {"v": "1"},
    {"worker": ""}, {"worker": "a:b"}, {"worker": "a b"}, {"worker": "a/b"},
    {"worker": "x" * 129}, {"worker": 7}, {"worker": "\u00e9"},
    {"incarnation": -1}, {"incarnation": MAX_TIMESTAMP * 2}, {"incarnation": True},
    {"incarnation": "1.7e9"}, {"incarnation": 1e400}, {"incarnation": None},
    {"seq": -1}, {"seq": MAX_SEQ + 1}, {"seq": 1.0}, {"seq": True}, {"seq": "3"},
    {"snapshot": 1}, {"final": 0}, {"final": False}, {"part": 1}, {"part": -1},
    {"snapshot": True, "part": 1 << 16}, {"snapshot": True, "part": 1.0},
    {"events": {}}, {"events": "[]"}, {"events": [[]]}, {"events": [["1", "2", "3"]]},
    {"events": [["1", 2]]}, {"events": [[1]]}, {"events": ["1"]},
    {"events": [["f" * 65]]}, {"events": [["0" * 65]]}, {"events": [["F"]]},
    {"events": [["-1"]]}, {"events": [["0x1"]]}, {"events": [[""]]}, {"events": [[" 1"]]},
    {"snapshot": True, "events": [["1", "2"], ["3"]]},
]  # fmt: skip


@pytest.mark.parametrize("change", BAD_FIELDS, ids=repr)
def test_every_field_out_of_its_rule_is_refused(change: dict[str, object]) -> None:
    reason, message = refused(sealed(body(**change)))
    assert reason == MALFORMED
    assert len(message) < 300  # quoted values are cut (they come from outside)


def test_the_same_rules_hold_when_a_batch_is_made() -> None:
    for kwargs in (
        {"worker_id": "a:b"},
        {"incarnation": float("nan")},
        {"seq": -1},
        {"events": [Stored(1, 2)]},  # a list, not a tuple
        {"events": ((1, 2),)},  # a tuple, not an event
        {"events": (Stored(HASH_LIMIT, 0),)},
        {"events": (Removed(-1),)},
        {"events": (Removed(True),)},
        {"final": False},
        {"snapshot": True, "events": (Removed(1),)},
    ):
        with pytest.raises(BatchError) as error:
            EventBatch(**{"worker_id": "w", "incarnation": 1.0, "seq": 0, **kwargs})  # type: ignore[arg-type]
        assert error.value.reason == MALFORMED


def test_worker_ids_follow_the_record_rule() -> None:
    # a drift between the two copies of the rule fails here
    assert WORKER_ID.pattern == records._WORKER_ID.pattern

"""KV events through a real Redis stream (issue 19): what workers XADD the router XREADs in
order, past junk that anyone with access to Redis could add, into the prefix index."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from proto.kv_events import EventBatch, Removed, Stored
from proto.kv_stream import (
    STREAM_FIELD,
    encode_batch,
    publish_batch,
    read_batches,
    stream_name,
)
from proto.records import FORGED, MALFORMED
from proto.registry import ClusterConfig
from proto.trust import new_secret
from router.placement.prefix_index import PrefixIndex
from tests.integration.pool_fixtures import running_redis

SECRET = new_secret()
KEYS = ClusterConfig(cluster="ev", cluster_secret=SECRET).keys


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[redis.Redis]:
    with running_redis(tmp_path_factory.mktemp("redis")) as client:
        yield client


def test_batches_cross_the_stream_in_order_into_the_index(client: redis.Redis) -> None:
    client.delete(stream_name(KEYS))
    sent = [
        EventBatch("p0", 1.0, 0, (Stored(11, 1), Stored(12, 11))),
        EventBatch("d0", 2.0, 0, (Stored(11, 1),)),
        EventBatch("p0", 1.0, 1, (Removed(12), Stored(13, 11))),
        EventBatch("d0", 2.0, 1, (Stored(12, 11),), snapshot=True, part=0, final=False),
    ]
    ids = [publish_batch(client, KEYS, batch) for batch in sent[:2]]
    client.xadd(stream_name(KEYS), {STREAM_FIELD: b"junk"})  # no MAC
    other = ClusterConfig(cluster="ev", cluster_secret=new_secret()).keys
    client.xadd(stream_name(KEYS), {STREAM_FIELD: encode_batch(other, sent[0])})
    elsewhere = ClusterConfig(cluster="other", cluster_secret=SECRET).keys
    client.xadd(stream_name(KEYS), {STREAM_FIELD: encode_batch(elsewhere, sent[0])})
    client.xadd(stream_name(KEYS), {b"x": encode_batch(KEYS, sent[0])})  # wrong field
    ids += [publish_batch(client, KEYS, batch) for batch in sent[2:]]

    first = read_batches(client, KEYS, count=5)
    assert [batch for _, batch in first.batches] == sent[:2]
    assert [entry for entry, _ in first.batches] == ids[:2]
    assert [r.reason for r in first.rejected] == [FORGED, FORGED, FORGED]
    assert all(r.key.startswith("ev:kv-events/") for r in first.rejected)
    rest = read_batches(client, KEYS, after=first.last_id, block_ms=100)
    assert [r.reason for r in rest.rejected] == [MALFORMED]
    assert [batch for _, batch in rest.batches] == sent[2:]
    assert rest.last_id == ids[-1]

    index = PrefixIndex()
    for _, batch in first.batches + rest.batches:
        index.apply(batch)
    assert index.matched_all([11, 12]) == {"p0": 1, "d0": 1}  # the snapshot is not final
    assert index.matched_all([11, 13]) == {"p0": 2, "d0": 1}

    nothing = read_batches(client, KEYS, after=rest.last_id, block_ms=50)
    assert (nothing.batches, nothing.rejected, nothing.last_id) == ([], [], rest.last_id)


def test_the_stream_is_capped(client: redis.Redis) -> None:
    client.delete(stream_name(KEYS))
    for seq in range(3000):
        publish_batch(client, KEYS, EventBatch("w", 1.0, seq, (Stored(seq, 0),)), maxlen=100)
    assert 100 <= client.xlen(stream_name(KEYS)) < 1000
    oldest = read_batches(client, KEYS, count=1)
    assert oldest.batches[0][1].seq > 2000  # the router sees a gap and waits for a snapshot

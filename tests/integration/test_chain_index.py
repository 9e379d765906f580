"""The pool's chain index (kvpool.chain_index) in a real Redis: what it indexes, what it
evicts and in which order, what it refuses while an eviction is under way."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from kvpool.chain_index import ChainIndex, IndexReplyError, Link
from kvpool.net import free_local_ports
from tests.integration.pool_fixtures import running_redis

SIZE = 10


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[redis.Redis]:
    with running_redis(tmp_path_factory.mktemp("redis")) as client:
        yield client


@pytest.fixture
def index(client: redis.Redis) -> Iterator[ChainIndex]:
    index = ChainIndex(client, "test:pool", doom_ttl_s=60)
    index.clear()
    yield index
    index.clear()


def run(*blocks: str, parent: str = "") -> list[Link]:
    """A run of blocks in chain order, the first extending ``parent``."""
    parents = [parent, *blocks[:-1]]
    return [Link(b, p, SIZE) for b, p in zip(blocks, parents, strict=True)]


def server_seconds(client: redis.Redis) -> float:
    seconds, micros = client.time()
    return float(seconds) + micros / 1e6


def no_holes(index: ChainIndex) -> None:
    """Every indexed block's parent is indexed (or it is a chain's first)."""
    indexed = set(index.blocks())
    for block in indexed:
        parent = index.parent_of(block)
        assert parent == "" or parent in indexed, f"{block} extends {parent}, which is gone"


def test_claims_index_chains_with_their_parents_and_sizes(index: ChainIndex) -> None:
    claimed = index.claim(run("a", "b", "c"))
    assert claimed.admitted == [True] * 3 and claimed.victims == []
    index.claim(run("d", parent="b"))
    assert (
        index.parent_of("d") == "b" and index.parent_of("a") == "" and index.parent_of("x") is None
    )
    stats = index.stats()
    assert (stats.blocks, stats.leaves, stats.used_bytes) == (4, 2, 4 * SIZE)
    index.claim(run("a", "b", "c"))  # a refresh adds nothing
    assert index.stats().used_bytes == 4 * SIZE
    assert index.blocks() == ["d", "a", "b", "c"]  # least recently used first


def test_eviction_takes_least_recently_used_leaves_never_a_block_with_a_child(
    index: ChainIndex,
) -> None:
    index.claim(run("a", "b", "c"))
    index.claim(run("a", "x"))  # a is now the newest... but has children
    # over a budget of 4 blocks, the 5th block evicts the oldest leaf: c (a is not a leaf)
    claimed = index.claim(run("y", parent="x"), budget=4 * SIZE)
    assert claimed.victims == ["c"]
    index.bury(claimed.victims)
    # then b became a leaf with its old tick: the next eviction takes it, never a or x
    claimed = index.claim(run("z"), budget=4 * SIZE)
    assert claimed.victims == ["b"]
    index.bury(claimed.victims)
    no_holes(index)
    assert sorted(index.blocks()) == ["a", "x", "y", "z"]
    assert index.stats().evicted == 2


def test_a_claim_never_evicts_its_own_blocks(index: ChainIndex) -> None:
    claimed = index.claim(run("a", "b", "c"), budget=1 * SIZE)
    assert claimed.admitted == [True] * 3 and claimed.victims == []
    assert index.stats().blocks == 3
    claimed = index.claim(run("d"), budget=1 * SIZE)  # now the older chain goes, tail first
    assert claimed.victims == ["c", "b", "a"]
    no_holes(index)


def test_blocks_being_evicted_and_their_children_are_refused_until_buried(
    index: ChainIndex,
) -> None:
    index.claim(run("a", "b"))
    victims = index.claim(run("z"), budget=2 * SIZE).victims
    assert victims == ["b"]  # doomed: its objects are being removed
    refused = index.claim(run("a", "b", "c"))
    assert refused.admitted == [True, False, False]  # b, and c which extends it
    assert index.stats().refused == 2 and index.parent_of("c") is None
    index.bury(victims)
    assert index.claim(run("a", "b", "c")).admitted == [True] * 3
    no_holes(index)


def test_a_buried_block_is_not_extended_until_it_is_written_again(index: ChainIndex) -> None:
    """A writer that read ``b`` before another writer evicted and buried it must not index
    ``c`` extending it: that would leave a block whose parent is gone."""
    index.claim(run("a", "b"))  # the reader's refresh of what it loaded
    victims = index.claim(run("z"), budget=2 * SIZE).victims
    assert victims == ["b"]
    index.bury(victims)
    assert index.claim(run("c", parent="b")).admitted == [False]
    assert index.parent_of("c") is None
    no_holes(index)
    assert index.claim(run("b", parent="a")).admitted == [True]  # written again
    assert index.claim(run("c", parent="b")).admitted == [True]
    no_holes(index)


def test_an_unburied_eviction_expires(client: redis.Redis) -> None:
    index = ChainIndex(client, "test:ttl", doom_ttl_s=0.001)
    index.clear()
    index.claim(run("a"))
    assert index.claim(run("b"), budget=SIZE).victims == ["a"]
    start = server_seconds(client)
    while server_seconds(client) < start + 0.002:  # until the doom ends on Redis's clock
        pass
    assert index.claim(run("a")).admitted == [True]
    index.clear()


def test_settle_forgets_what_did_not_land_and_names_what_was_evicted_meanwhile(
    index: ChainIndex,
) -> None:
    index.claim(run("a", "b", "c"))
    assert index.settle(["a"], ["c", "b"]) == []  # tail first: both leaves in turn
    assert index.blocks() == ["a"] and index.stats().forgotten == 2
    index.claim(run("a", "b"))
    assert index.settle([], ["a"]) == []  # a has a child: kept
    assert index.parent_of("a") == ""
    index.claim(run("q"), budget=2 * SIZE)  # evicts b (the oldest leaf), as another writer
    assert index.settle(["a", "b"], []) == ["b"]


def test_a_block_whose_parent_is_not_indexed_keeps_that_parent_off_the_leaves(
    index: ChainIndex,
) -> None:
    index.claim(run("child", parent="p"))
    index.claim(run("p"))  # indexed after its child
    victims = index.claim(run("z"), budget=2 * SIZE).victims
    assert victims == ["child"]  # not p, which "child" extends
    index.bury(victims)
    assert index.claim(run("w"), budget=2 * SIZE).victims == ["p"]


def test_malformed_answers_are_refused(index: ChainIndex) -> None:
    with pytest.raises(ValueError, match="size"):
        index.claim([Link("a", "", -1)])
    index.client.set(index.keys[5], "not a number")  # "used" broken by a writer of Redis
    with pytest.raises((redis.RedisError, IndexReplyError)):
        index.claim(run("a"), budget=SIZE)


def test_an_unreachable_index_is_counted_and_the_pool_goes_on() -> None:
    from kvpool.evictor import ChainEvictor
    from kvpool.keys import KeySpace
    from tests.integration.pool_fixtures import NAMESPACE

    (port,) = free_local_ports(1)  # nothing listens there
    dead = redis.Redis(port=port, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))
    evictor = ChainEvictor(
        ChainIndex(dead, "dead:pool"),
        store=None,  # type: ignore[arg-type]  # never reached: nothing is evicted
        keys=KeySpace.of(NAMESPACE, 2),
        block_bytes=SIZE,
        budget=lambda: 0,
    )
    assert evictor.admit([1, 2], [None, 1]) == [True, True]  # written, as without an index
    assert evictor.stats.index_errors == 1 and not evictor.index_up
    evictor.touch([1], [None])  # within the backoff: not asked
    evictor.settle(["a"], ["b"])
    assert evictor.admit([3], [2]) == [True]
    assert evictor.stats.index_errors == 1 and evictor.stats.evicted_blocks == 0

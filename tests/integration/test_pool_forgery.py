"""Forged pool blocks against a real mooncake_master (issue 17: unforgeable blocks).

The victim's pool members share a cluster secret; the attacker is a pool member without it
(no secret at all, or another cluster's). It sees every key in the pool's listing, so it
knows the victim's block names, and it can remove and put any object. What it writes under
a victim's name carries layer digests valid for its own data; only the meta's MAC (keyed
with the secret, bound to the block's name) gives it away. Checked: the victim's
``load``, ``partials.take`` and landings (the decode side's streaming read) never hand such a
block over; ``forged_blocks`` counts it and it is removed, so the victim republishes the
real one; a genuine block moved under another name, and a genuine meta over swapped layer
data, are refused the same way.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest

from kvpool.hashing import PrefixHasher
from kvpool.landing import Lander, Landing
from kvpool.master import MasterConfig
from kvpool.meta import BlockMeta
from kvpool.pool import KVPool, PendingBlock, PoolStats
from kvpool.store import MooncakeStore
from proto.trust import POOL_BLOCK, PREFIX_ROOT, derive
from tests.integration.pool_fixtures import LAYOUT, NAMESPACE, make_slab, pool_config
from tests.integration.pool_fixtures import running_master as start_master
from tests.staging import pool_memory

pytestmark = pytest.mark.kv_path

SECRET = "v" * 64
HASHER = PrefixHasher(NAMESPACE, derive(SECRET, PREFIX_ROOT))
BT = LAYOUT.block_tokens
ATTACKERS = {"no-secret": derive("", POOL_BLOCK), "other-secret": derive("a" * 64, POOL_BLOCK)}


@pytest.fixture(scope="module")
def master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MasterConfig]:
    with start_master(tmp_path_factory.mktemp("forgery")) as cfg:
        yield cfg


class Members:
    """The victim's writer and reader (with the secret) and the attacker (without)."""

    def __init__(self, master: MasterConfig, attacker_key: bytes, run: int = 0) -> None:
        self.run = run
        """Makes this run's prompts its own (the master outlives a test)."""
        self.source, self.target, self.junk = make_slab(1), make_slab(), make_slab(666)
        self.pools: list[KVPool] = []
        self.writer = self._join(master, self.source, derive(SECRET, POOL_BLOCK), "victim-w")
        self.reader = self._join(master, self.target, derive(SECRET, POOL_BLOCK), "victim-r")
        self.attacker = self._join(master, self.junk, attacker_key, "attacker")

    def _join(self, master: MasterConfig, slab: np.ndarray, key: bytes, name: str) -> KVPool:
        store = MooncakeStore.connect(pool_config(master, segment_mib=16))
        pool = KVPool(store, NAMESPACE, LAYOUT, pool_memory(slab, LAYOUT), name, 60.0, key)
        self.pools.append(pool)
        return pool

    def chain(self, seed: int, blocks: int) -> list[int]:
        rng = np.random.default_rng([self.run, seed])
        tokens = rng.integers(0, 50000, blocks * BT).tolist()
        return HASHER.chain(tokens, BT)

    def forge(self, meta_key: str, page: int, extra: dict[str, float] | None = None) -> None:
        """The attacker replaces the block named ``meta_key`` with its own page ``page``:
        layers and a meta whose digests match them, MAC'd with the attacker's key."""
        self.attacker.store.remove([meta_key, *self.attacker.keys.layer_keys(meta_key)])
        block = PendingBlock(meta_key, page, extra or {})
        assert self.attacker.begin_write([block]).write_all() == 1

    def fresh(self) -> Members:
        """These members as a test starts: the reader's slab zeroed, every counter at 0
        (the tests of one module share them: joining and leaving the pool costs seconds)."""
        self.target[:] = 0
        for pool in self.pools:
            pool.stats = PoolStats()
        return self

    def close(self) -> None:
        for pool in self.pools:
            pool.close()
            pool.store.close()


@pytest.fixture(scope="module", params=sorted(ATTACKERS))
def joined(request: pytest.FixtureRequest, master: MasterConfig) -> Iterator[Members]:
    m = Members(master, ATTACKERS[request.param], sorted(ATTACKERS).index(request.param))
    yield m
    m.close()


@pytest.fixture
def members(joined: Members) -> Members:
    """The module's members for one attacker, fresh (each test uses its own prompts)."""
    return joined.fresh()


def untouched(m: Members, pages: list[int]) -> bool:
    return not m.target[:, pages].any()


def test_a_forged_block_is_never_loaded_and_is_healed(members: Members) -> None:
    m = members
    hashes = m.chain(1, 3)
    assert m.writer.save(hashes, [0, 1, 2]) == 3
    m.forge(m.writer.keys.meta_key(hashes[1]), page=5)
    assert m.reader.lookup(hashes) == 3  # present, valid digests: only the MAC is wrong
    assert m.reader.load(hashes, [7, 8, 9]) == 1
    assert m.reader.stats.forged_blocks == 1 and m.reader.stats.checksum_failures == 0
    assert untouched(m, [8, 9])  # the MAC is checked before any layer is read
    assert np.array_equal(m.target[:, 7], m.source[:, 0])
    assert m.reader.lookup(hashes) == 1  # removed ...
    assert m.writer.save(hashes, [0, 1, 2]) == 1  # ... so the victim publishes it again
    assert m.reader.load(hashes, [7, 8, 9]) == 3
    assert np.array_equal(m.target[:, 7:10], m.source[:, 0:3])


def test_a_genuine_block_moved_under_another_name_is_forged(members: Members) -> None:
    m = members
    (a,), (b,) = m.chain(2, 1), m.chain(3, 1)
    assert m.writer.save([a], [0]) == 1
    src, dst = m.writer.keys.meta_key(a), m.writer.keys.meta_key(b)
    spans = [m.attacker.slab_ptr + LAYOUT.offset(layer, 4) for layer in range(LAYOUT.num_layers)]
    sizes = [LAYOUT.span_bytes] * LAYOUT.num_layers
    assert m.attacker.store.get_into(m.attacker.keys.layer_keys(src), spans, sizes) == sizes
    assert m.attacker.store.put_from(m.attacker.keys.layer_keys(dst), spans, sizes) == [0] * 3
    assert m.attacker.store.put_bytes([dst], m.attacker.store.get_bytes([src])) == 0
    assert m.reader.lookup([b]) == 1
    assert m.reader.load([b], [7]) == 0
    assert m.reader.stats.forged_blocks == 1 and untouched(m, [7])


def test_a_meta_read_racing_a_reuse_is_a_short_read_not_a_forgery(members: Members) -> None:
    """A reader that fetched a block's meta while an eviction removed it and another
    block's meta took its memory holds bytes that fit but whose MAC fails under this name.
    Read again, the name holds something else: a race, not a forgery (the forged-block
    counter is what operators watch); the block is refused this time and not removed."""
    m = members
    (a,), (b,) = m.chain(6, 1), m.chain(7, 1)
    assert m.writer.save([a], [0]) == 1 and m.writer.save([b], [1]) == 1
    key_a, key_b = m.writer.keys.meta_key(a), m.writer.keys.meta_key(b)
    (other,) = m.reader.store.get_bytes([key_b])  # what the reused memory held
    assert not isinstance(m.reader.parse_meta(other, key_a), BlockMeta)
    assert (m.reader.stats.forged_blocks, m.reader.stats.short_reads) == (0, 1)
    assert m.reader.load([a], [7]) == 1  # still there: nothing was removed
    assert np.array_equal(m.target[:, 7], m.source[:, 0])
    m.forge(key_a, page=5)  # a forgery reads the same twice: counted and removed
    (forged,) = m.reader.store.get_bytes([key_a])
    assert not isinstance(m.reader.parse_meta(forged, key_a), BlockMeta)
    assert m.reader.stats.forged_blocks == 1 and m.reader.lookup([a]) == 0


def test_swapped_layer_data_under_a_genuine_meta_fails_its_digest(members: Members) -> None:
    m = members
    hashes = m.chain(4, 2)
    assert m.writer.save(hashes, [0, 1]) == 2
    layer_of = [m.writer.keys.layer_keys(m.writer.keys.meta_key(h))[1] for h in hashes]
    m.attacker.store.remove([layer_of[0]])  # block 0's layer 1 := block 1's layer 1
    span = m.writer.slab_ptr + LAYOUT.offset(1, 1)
    assert m.attacker.store.put_from([layer_of[0]], [span], [LAYOUT.span_bytes]) == [0]
    assert m.reader.load(hashes, [7, 8]) == 0
    assert m.reader.stats.checksum_failures == 1 and m.reader.stats.forged_blocks == 0
    assert m.reader.lookup(hashes) == 0  # removed


def test_a_forged_partial_block_is_never_taken(members: Members) -> None:
    m = members
    assert m.writer.partials.put("req-1", page=2, num_tokens=3)
    key = m.writer.keys.request_key("req-1")  # the attacker reads it off the key listing
    m.forge(key, page=6, extra={"tokens": BT, "expires": time.time() + 1e6})
    assert m.reader.partials.take("req-1", page=7) is None
    assert m.reader.stats.forged_blocks == 1 and untouched(m, [7])


def land(m: Members, meta_keys: list[str], pages: list[int]) -> Landing:
    lander = Lander()
    try:
        landing = lander.add(Landing(m.reader, meta_keys, pages, time.monotonic() + 30))
        assert landing.done.wait(20), "the landing never ended"
        return landing
    finally:
        lander.close()


def test_a_landing_never_hands_over_a_forged_block(members: Members) -> None:
    m = members
    hashes = m.chain(5, 3)
    assert m.writer.save(hashes, [0, 1, 2]) == 3
    keys = [m.writer.keys.meta_key(h) for h in hashes]
    m.forge(keys[1], page=5)
    landing = land(m, keys, [7, 8, 9])
    assert [meta.sums for meta in landing.wait(0.0)] == [
        [m.reader.digest(m.writer.slab_ptr + LAYOUT.offset(layer, 0), LAYOUT.span_bytes)
         for layer in range(LAYOUT.num_layers)]
    ]  # fmt: skip
    assert m.reader.stats.forged_blocks == 1
    assert m.reader.lookup(hashes) == 1  # the forged block was removed


def test_a_landing_never_hands_over_swapped_layer_data(members: Members) -> None:
    m = members
    hashes = m.chain(6, 2)
    assert m.writer.save(hashes, [0, 1]) == 2
    keys = [m.writer.keys.meta_key(h) for h in hashes]
    layer0 = m.writer.keys.layer_keys(keys[0])[0]
    m.attacker.store.remove([layer0])
    span = m.attacker.slab_ptr + LAYOUT.offset(0, 3)  # the attacker's own data
    assert m.attacker.store.put_from([layer0], [span], [LAYOUT.span_bytes]) == [0]
    assert land(m, keys, [7, 8]).wait(0.0) == []
    assert m.reader.stats.checksum_failures == 1


def test_the_secret_shares_names_and_blocks_between_members(master: MasterConfig) -> None:
    """The control: members with the same secret load each other's blocks."""
    m = Members(master, derive(SECRET, POOL_BLOCK), run=len(ATTACKERS))
    try:
        hashes = m.chain(7, 2)
        assert m.attacker.save(hashes, [0, 1]) == 2  # the "attacker" holds the secret here
        assert m.reader.load(hashes, [7, 8]) == 2
        assert np.array_equal(m.target[:, 7:9], m.junk[:, 0:2])
        assert m.reader.stats.forged_blocks == 0
    finally:
        m.close()

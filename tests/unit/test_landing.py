"""Landings (kvpool/landing.py) over an in-memory stand-in for the Mooncake client.

The real :class:`~kvpool.store.MooncakeStore`, :class:`~kvpool.pool.KVPool` and
:class:`~kvpool.landing.Lander` thread run over :class:`FakeClient`, a dict of objects that
the test fills as a prefill worker would (layers first, meta last), or leaves holes in. What
is checked: a cancelled or expired landing keeps the leading blocks it read in full and
verified; a landing whose last block never lands stalls in well under the old fixed wait;
a failed read ends it early; the decode side then computes only the missing tokens.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from kvpool.hashing import Namespace, PrefixHasher
from kvpool.landing import Lander, Landing
from kvpool.layout import KVLayout
from kvpool.meta import digest_bytes
from kvpool.pool import BlockMeta, KVPool
from kvpool.store import MooncakeStore
from tests.staging import pool_memory
from workers.core.scheduler import Scheduler, SchedulerConfig
from workers.handoff.pool_transfer import pull_prompt
from workers.handoff.reservations import Reservations

pytestmark = pytest.mark.kv_path

LAYOUT = KVLayout(
    num_layers=3, num_blocks=16, block_tokens=8, kv_heads=2, head_dim=4, dtype="float32"
)
NAMESPACE = Namespace(model="landingtest@0", dtype="float32", block_tokens=8)
SPAN = LAYOUT.span_bytes
MISSING = -704  # the binding's "object not found"
OLD_WAIT_S = 10.0  # what the decode side used to wait for a block that never lands


class FakeClient:
    """The binding's verbs over a dict; ``broken`` keys exist but fail to read."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.broken: set[str] = set()
        self.meta_gets = 0

    def register_buffer(self, ptr: int, size: int) -> int:
        return 0

    def health_check(self) -> int:
        return 0

    def batch_is_exist(self, keys: list[str]) -> list[int]:
        return [int(k in self.objects) for k in keys]

    def batch_get_into(self, keys: list[str], ptrs: list[int], sizes: list[int]) -> list[int]:
        out = []
        for key, ptr, size in zip(keys, ptrs, sizes, strict=True):
            data = self.objects.get(key)
            if data is None or key in self.broken:
                out.append(MISSING)
                continue
            ctypes.memmove(ptr, data, min(size, len(data)))
            out.append(min(size, len(data)))
        return out

    def get_batch(self, keys: list[str]) -> list[bytes]:
        self.meta_gets += 1
        return [self.objects.get(k, b"") for k in keys]

    def batch_remove(self, keys: list[str], force: bool) -> list[int]:
        return [0 if self.objects.pop(k, None) is not None else MISSING for k in keys]


class Harness:
    """A pool over a zeroed slab, its fake client, and the writer's side of it."""

    def __init__(self) -> None:
        self.client = FakeClient()
        self.slab = np.zeros(LAYOUT.slab_bytes, dtype=np.uint8)
        store = MooncakeStore(self.client)
        self.pool = KVPool(store, NAMESPACE, LAYOUT, pool_memory(self.slab, LAYOUT), "reader")
        self.rng = np.random.default_rng(0)
        self.sums: dict[str, list[bytes]] = {}

    def layer(self, key: str, layer: int) -> None:
        data = self.rng.integers(0, 256, SPAN, dtype=np.uint8).tobytes()
        digest = digest_bytes(NAMESPACE.algorithm, data)
        self.sums.setdefault(key, [b""] * LAYOUT.num_layers)[layer] = digest
        self.client.objects[f"{key}/{layer}"] = data

    def meta(self, key: str, sums: list[bytes] | None = None) -> BlockMeta:
        sums = self.sums[key] if sums is None else sums
        self.client.objects[key] = self.pool.codec.encode(key, sums, {})
        return BlockMeta(sums=sums)

    def block(self, key: str) -> BlockMeta:
        """Every layer, then the meta (the commit rule)."""
        for layer in range(LAYOUT.num_layers):
            self.layer(key, layer)
        return self.meta(key)

    def page(self, page: int, layer: int) -> bytes:
        start = LAYOUT.offset(layer, page)
        return self.slab[start : start + SPAN].tobytes()


@pytest.fixture
def h() -> Harness:
    return Harness()


@pytest.fixture
def lander() -> Iterator[Lander]:
    lander = Lander()
    yield lander
    lander.close()


def keys(n: int) -> list[str]:
    return [f"{NAMESPACE.key}/b/{i:016x}" for i in range(n)]


def landing(h: Harness, n: int, deadline_s: float = 60.0) -> Landing:
    return Landing(h.pool, keys(n), list(range(2, 2 + n)), time.monotonic() + deadline_s)


def wait_for(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.005)


def read_objects(land: Landing) -> int:
    return sum(1 for block in land.got for n in block if n > 0)


@pytest.mark.parametrize("defect", ["none", "no-meta", "bad-sum"])
def test_a_cancelled_landing_keeps_the_leading_blocks_it_read(
    h: Harness, lander: Lander, defect: str
) -> None:
    k = keys(4)
    meta0 = h.block(k[0])
    for layer in range(LAYOUT.num_layers):
        h.layer(k[1], layer)
    expected = [meta0]
    if defect == "none":
        expected.append(h.meta(k[1]))
    elif defect == "bad-sum":
        h.meta(k[1], [bytes(len(s)) for s in h.sums[k[1]]])
    h.layer(k[2], 0)  # block 2 only partly in: not kept, nor anything after it
    land = lander.add(landing(h, 4))
    wait_for(lambda: read_objects(land) == 2 * LAYOUT.num_layers + 1)
    lander.cancel(land)
    assert land.done.is_set() and land.wait(0.0) == expected
    assert h.pool.stats.checksum_failures == (defect == "bad-sum")
    assert h.pool.stats.short_reads == 0
    assert h.page(2, 1) == h.client.objects[f"{k[0]}/1"]
    h.layer(k[2], 1)  # written after the cancel: never read into the (reusable) page
    time.sleep(0.1)
    assert h.page(4, 1) == bytes(SPAN)


def test_a_cancel_that_releases_the_pages_verifies_nothing(h: Harness, lander: Lander) -> None:
    h.block(keys(2)[0])
    land = lander.add(landing(h, 2))
    wait_for(lambda: read_objects(land) == LAYOUT.num_layers)
    gets = h.client.meta_gets
    lander.cancel(land, keep=False)
    assert land.wait(0.0) == [] and h.client.meta_gets == gets


def test_a_landing_past_its_deadline_keeps_what_it_verified(h: Harness, lander: Lander) -> None:
    metas = [h.block(key) for key in keys(2)]  # block 2 never lands
    land = lander.add(landing(h, 3))
    wait_for(lambda: read_objects(land) == 2 * LAYOUT.num_layers)  # blocks 0 and 1 read
    land.deadline = time.monotonic()  # then its time is up (a lander slowed by a loaded
    lander.nudge()  # machine must not miss reads that a wall-clock deadline would cut)
    assert land.done.wait(OLD_WAIT_S / 2)
    assert land.wait(0.0) == metas


def test_a_landing_whose_last_block_never_lands_stalls_quickly(h: Harness, lander: Lander) -> None:
    metas = [h.block(key) for key in keys(3)]
    land = lander.add(landing(h, 4))
    t0 = time.monotonic()
    assert not land.settle(0.3, OLD_WAIT_S)
    assert time.monotonic() - t0 < OLD_WAIT_S / 2
    lander.cancel(land)
    assert land.wait(0.0) == metas


def test_settle_waits_while_objects_keep_arriving(h: Harness, lander: Lander) -> None:
    """15 objects 0.1 s apart: 1.5 s in all, past a 1 s stall that ignored progress."""
    k = keys(5)
    land = lander.add(landing(h, 5))

    def write() -> None:
        for key in k:
            for layer in range(LAYOUT.num_layers):
                time.sleep(0.1)
                h.layer(key, layer)
        for key in k:
            h.meta(key)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        assert land.settle(1.0, OLD_WAIT_S * 3)
    finally:
        writer.join()
    assert len(land.wait(0.0)) == 5


def test_settle_gives_up_at_its_cap_on_a_trickling_landing(h: Harness, lander: Lander) -> None:
    k = keys(12)
    land = lander.add(landing(h, 12))
    stop = threading.Event()

    def trickle() -> None:
        for key in k:
            for layer in range(LAYOUT.num_layers):
                if stop.wait(0.05):
                    return
                h.layer(key, layer)

    writer = threading.Thread(target=trickle)
    writer.start()
    try:
        assert not land.settle(OLD_WAIT_S, 0.5)
    finally:
        stop.set()
        writer.join()
    assert not land.done.is_set()


def test_a_failed_read_ends_the_landing_without_waiting_for_later_blocks(
    h: Harness, lander: Lander
) -> None:
    k = keys(4)
    meta0, _, _ = h.block(k[0]), h.block(k[1]), h.block(k[2])  # block 3 never lands
    h.client.broken.add(f"{k[1]}/1")  # e.g. evicted between the existence poll and the read
    land = lander.add(landing(h, 4))
    assert land.done.wait(OLD_WAIT_S / 2)
    assert land.wait(0.0) == [meta0]
    assert h.pool.stats.short_reads == 1


def test_the_decode_side_computes_only_what_never_landed(h: Harness) -> None:
    """Reserve (the landing starts), three of five blocks land, the wait stalls, the take-over
    keeps those three: 24 of the 40 prompt tokens are computed, 16 left to the engine."""
    config = SchedulerConfig(
        num_blocks=LAYOUT.num_blocks,
        block_tokens=LAYOUT.block_tokens,
        max_num_seqs=2,
        max_num_batched_tokens=64,
        max_model_len=64,
    )
    reservations = Reservations(Scheduler(config, PrefixHasher(NAMESPACE)), h.pool, streaming=True)
    prompt = list(range(100, 140))
    try:
        seq = reservations.reserve("r1", prompt, max_tokens=2, lease_s=60.0)
        land = reservations.landing("r1")
        assert seq is not None and land is not None and len(land.meta_keys) == 5
        for key in land.meta_keys[:3]:
            h.block(key)
        reservations.nudge()
        t0 = time.monotonic()
        land.settle(0.3, OLD_WAIT_S)
        assert time.monotonic() - t0 < OLD_WAIT_S / 2
        held = reservations.take("r1", prompt)
        assert held is not None
        taken, taken_landing = held.seq, held.landing
        assert taken is seq and taken_landing is land
        pull_prompt(h.pool, reservations.scheduler.blocks, seq, land)
        assert seq.num_pool_tokens == 24 and seq.num_computed_tokens == 24
        assert seq.num_prompt_tokens - seq.num_computed_tokens == 16
    finally:
        reservations.close()

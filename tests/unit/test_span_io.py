"""Span transfers (kvpool/span_io.py): in place and through staging slots, exactly alike.

The real :class:`~kvpool.span_io.DirectIO` / :class:`~kvpool.span_io.StagedIO` and the real
:class:`~workers.handoff.staging.TorchCopier` (on the CPU) over :class:`FakeClient` (the Mooncake
binding's verbs over a dict, from the landing tests). What is checked: a staged send puts
the same bytes and returns the same digests as one in place, over several rounds of slots;
a staged receive lands exactly the spans read in full in their pages and nothing else; the
in-place variant of a copier (``--kv-staging never`` on a GPU) transfers from the cache
itself and still digests; threads that share the slots all finish with the right bytes.
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np
import pytest
import torch

from kvpool.layout import KVLayout
from kvpool.meta import digest_bytes, layer_digest
from kvpool.span_io import CacheSpan, DirectIO, SlotPool, StagedIO
from kvpool.store import MooncakeStore
from tests.unit.test_landing import MISSING, FakeClient
from workers.handoff.staging import MIN_SLOTS, SlabViews, TorchCopier, slots_for

LAYOUT = KVLayout(
    num_layers=2, num_blocks=8, block_tokens=4, kv_heads=2, head_dim=4, dtype="float32"
)
SPAN = LAYOUT.span_bytes
ALGO = "xxh3"
DIGEST = layer_digest(ALGO)
SPANS = [CacheSpan(layer, page) for page in (5, 1, 6, 2, 7) for layer in range(2)]
KEYS = [f"k{i}" for i in range(len(SPANS))]


class PutClient(FakeClient):
    """The fake binding with puts; ``refuse`` keys fail to put."""

    def __init__(self) -> None:
        super().__init__()
        self.refuse: set[str] = set()
        self.registered: list[tuple[int, int]] = []

    def register_buffer(self, ptr: int, size: int) -> int:
        self.registered.append((ptr, size))
        return 0

    def unregister_buffer(self, ptr: int) -> int:
        return 0

    def batch_put_from(self, keys: list[str], ptrs: list[int], sizes: list[int]) -> list[int]:
        out = []
        for key, ptr, size in zip(keys, ptrs, sizes, strict=True):
            if key in self.refuse:
                out.append(-1)
                continue
            self.objects[key] = ctypes.string_at(ptr, size)
            out.append(0)
        return out


def slab(seed: int | None) -> np.ndarray:
    shape = (LAYOUT.num_layers, LAYOUT.num_blocks, SPAN)
    if seed is None:
        return np.zeros(shape, dtype=np.uint8)
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def staged(data: np.ndarray, client: PutClient, slots: int, in_place: bool = False) -> StagedIO:
    copier = TorchCopier(SlabViews(torch.from_numpy(data)), slots, in_place=in_place)
    return StagedIO(MooncakeStore(client), LAYOUT, copier, DIGEST)


def span_bytes(data: np.ndarray, span: CacheSpan) -> bytes:
    return bytes(data[span.layer, span.page].tobytes())


@pytest.mark.parametrize("slots", [MIN_SLOTS, 5, 64])
def test_staged_send_puts_the_same_bytes_and_digests_as_in_place(slots: int) -> None:
    data = slab(1)
    direct_client, staged_client = PutClient(), PutClient()
    direct = DirectIO(MooncakeStore(direct_client), LAYOUT, data.ctypes.data, DIGEST)
    io = staged(data, staged_client, slots)
    sums = io.send(KEYS, SPANS)
    assert sums == direct.send(KEYS, SPANS)
    assert sums == [digest_bytes(ALGO, span_bytes(data, s)) for s in SPANS]
    assert staged_client.objects == direct_client.objects
    assert staged_client.objects["k3"] == span_bytes(data, SPANS[3])
    assert io.slots.n == slots and len(io.slots._free) == slots  # every slot came back


def test_a_failed_put_has_no_digest_and_the_rest_go_on() -> None:
    client = PutClient()
    client.refuse = {"k2"}
    sums = staged(slab(2), client, MIN_SLOTS).send(KEYS, SPANS)
    assert sums[2] is None and all(s is not None for i, s in enumerate(sums) if i != 2)
    assert "k2" not in client.objects and "k3" in client.objects


def test_staged_receive_lands_only_what_was_read_in_full() -> None:
    source, target = slab(3), slab(None)
    client = PutClient()
    staged(source, client, MIN_SLOTS).send(KEYS, SPANS)
    client.objects["k4"] = client.objects["k4"][: SPAN // 2]  # a short read
    client.broken.add("k6")  # a failed read
    got = staged(target, client, MIN_SLOTS).receive(KEYS, SPANS)
    assert [g.nbytes for g in got] == [
        SPAN // 2 if i == 4 else MISSING if i == 6 else SPAN for i in range(len(SPANS))
    ]
    for i, span in enumerate(SPANS):
        if i in (4, 6):
            assert got[i].digest == b"" and not target[span.layer, span.page].any()
        else:
            assert got[i].digest == digest_bytes(ALGO, span_bytes(source, span))
            assert span_bytes(target, span) == span_bytes(source, span)
    untouched = [CacheSpan(layer, page) for page in (0, 3, 4) for layer in range(2)]
    assert not any(target[s.layer, s.page].any() for s in untouched)


def test_in_place_copier_transfers_from_the_cache_and_digests_a_host_copy() -> None:
    source, target = slab(4), slab(None)
    client = PutClient()
    writer = staged(source, client, MIN_SLOTS, in_place=True)
    assert (source.ctypes.data, LAYOUT.slab_bytes) in client.registered
    sums = writer.send(KEYS, SPANS)
    assert sums == [digest_bytes(ALGO, span_bytes(source, s)) for s in SPANS]
    got = staged(target, client, MIN_SLOTS, in_place=True).receive(KEYS, SPANS)
    assert [g.digest for g in got] == sums
    assert np.array_equal(source[:, [1, 2, 5, 6, 7]], target[:, [1, 2, 5, 6, 7]])


def test_threads_sharing_few_slots_all_move_their_spans() -> None:
    data, client = slab(5), PutClient()
    io = staged(data, client, MIN_SLOTS)
    expected = [digest_bytes(ALGO, span_bytes(data, s)) for s in SPANS]
    errors: list[BaseException] = []

    def send(t: int) -> None:
        try:
            for r in range(20):
                assert io.send([f"t{t}-{r}-{k}" for k in KEYS], SPANS) == expected
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=send, args=(t,)) for t in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert len(io.slots._free) == MIN_SLOTS


def test_slot_pool_hands_out_whole_rounds_and_takes_them_back() -> None:
    pool = SlotPool(4)
    with pool.taken(3) as first:
        assert len(set(first)) == 3
        got: list[list[int]] = []
        waiter = threading.Thread(target=lambda: got.append(_take(pool, 2)))
        waiter.start()
        waiter.join(0.2)
        assert waiter.is_alive() and not got  # 1 free: it waits for a whole round
    waiter.join(5)
    assert len(got) == 1 and len(got[0]) == 2


def _take(pool: SlotPool, k: int) -> list[int]:
    with pool.taken(k) as slots:
        return list(slots)


def test_slots_for_a_memory_setting() -> None:
    assert slots_for(1, 1 << 10) == 1024
    assert slots_for(1, 1 << 20) == MIN_SLOTS

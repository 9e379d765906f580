"""Layer-by-layer verified loads (``kvpool.layer_load``), over the fake Mooncake binding
and a staged cache: each span reaches its page only if its digest is the meta's; a block
that fails cuts the rest of its run; tails are read apart; counts and healing."""

from __future__ import annotations

import time

import pytest
import torch

from kvpool.layer_load import LayerLoad, LoadRun
from kvpool.pool import KVPool
from kvpool.store import MooncakeStore
from tests.unit.test_landing import LAYOUT, NAMESPACE, SPAN, Harness
from workers.handoff.staging import SlabViews, TorchCopier


def staged_harness() -> Harness:
    """The landing tests' harness over a staged cache (the connector's case)."""
    harness = Harness()
    spans = harness.slab.reshape(LAYOUT.num_layers, LAYOUT.num_blocks, SPAN)
    copier = TorchCopier(SlabViews(torch.from_numpy(spans)), 8)
    store = MooncakeStore(harness.client)
    harness.pool = KVPool(store, NAMESPACE, LAYOUT, copier, "reader")
    return harness


def run_of(h: Harness, keys: list[str], pages: list[int], tail: int = 0) -> LoadRun:
    names = list(range(1, len(keys) + 1 - bool(tail)))
    return LoadRun(keys, pages, names, [], tail)


def partial(h: Harness, key: str, tokens: int, expires_in: float) -> None:
    """A partial block under ``key``: its layers, then its meta with tokens and lease."""
    for layer in range(LAYOUT.num_layers):
        h.layer(key, layer)
    extra = {"tokens": tokens, "expires": time.time() + expires_in}
    h.client.objects[key] = h.pool.codec.encode(key, h.sums[key], extra)


def read_all(load: LayerLoad) -> list[int]:
    load.read_metas()
    for layer in range(LAYOUT.num_layers):
        load.read_layer(layer, tails=True)
        load.read_layer(layer)
    return load.finish()


def test_whole_blocks_arrive_in_their_pages() -> None:
    h = staged_harness()
    keys = [h.pool.keys.meta_key(n) for n in (1, 2)]
    for key in keys:
        h.block(key)
    assert read_all(LayerLoad(h.pool, [run_of(h, keys, [3, 5])])) == [2]
    for key, page in zip(keys, [3, 5], strict=True):
        for layer in range(LAYOUT.num_layers):
            assert h.page(page, layer) == h.client.objects[f"{key}/{layer}"]
    assert h.pool.stats.hit_blocks == 2 and h.pool.stats.bytes_read == 2 * 3 * SPAN


def test_an_altered_layer_never_reaches_its_page_and_cuts_the_run() -> None:
    h = staged_harness()
    keys = [h.pool.keys.meta_key(n) for n in (1, 2, 3)]
    for key in keys:
        h.block(key)
    bad = f"{keys[1]}/1"
    h.client.objects[bad] = bytes(b ^ 1 for b in h.client.objects[bad])
    other = [h.pool.keys.meta_key(9)]
    h.block(other[0])
    good = read_all(LayerLoad(h.pool, [run_of(h, keys, [0, 1, 2]), run_of(h, other, [7])]))
    assert good == [1, 1]  # the other run is not hurt
    assert h.page(1, 1) == bytes(SPAN)  # the altered span stayed out
    assert h.page(2, 2) == bytes(SPAN)  # a later block of the run is not read on
    assert h.pool.stats.checksum_failures == 1 and h.pool.stats.healed_blocks == 1
    assert keys[1] not in h.client.objects  # removed: a writer may publish it again


def test_a_missing_meta_or_short_layer_ends_the_run_there() -> None:
    h = staged_harness()
    keys = [h.pool.keys.meta_key(n) for n in (1, 2, 3)]
    for key in keys:
        h.block(key)
    del h.client.objects[keys[2]]  # block 2: no meta
    h.client.objects[f"{keys[1]}/0"] = b"short"
    assert read_all(LayerLoad(h.pool, [run_of(h, keys, [0, 1, 2])])) == [1]
    assert h.pool.stats.short_reads == 1 and h.pool.stats.miss_blocks == 2


def test_tails_are_read_apart_and_only_count_after_whole_blocks() -> None:
    h = staged_harness()
    keys = [h.pool.keys.meta_key(1), h.pool.keys.request_key("r")]
    h.block(keys[0])
    partial(h, keys[1], 5, 60.0)
    load = LayerLoad(h.pool, [run_of(h, keys, [4, 6], tail=5)])
    load.read_metas()
    for layer in range(LAYOUT.num_layers):
        load.read_layer(layer, tails=True)
    assert h.page(6, 0) == h.client.objects[f"{keys[1]}/0"] and h.page(4, 0) == bytes(SPAN)
    for layer in range(LAYOUT.num_layers):
        load.read_layer(layer)
    assert load.finish() == [2]
    assert h.pool.stats.hit_blocks == 1  # the tail is no prefix block


@pytest.mark.parametrize(
    ("tokens", "expires_in"), [(4, 60.0), (6, 60.0), (5, -1.0)], ids=["fewer", "more", "expired"]
)
def test_a_tail_of_other_tokens_or_past_its_lease_is_not_taken(
    tokens: int, expires_in: float
) -> None:
    h = staged_harness()
    keys = [h.pool.keys.meta_key(1), h.pool.keys.request_key("r")]
    h.block(keys[0])
    partial(h, keys[1], tokens, expires_in)
    assert read_all(LayerLoad(h.pool, [run_of(h, keys, [4, 6], tail=5)])) == [1]
    assert h.page(6, 0) == bytes(SPAN)  # nothing of it reached its page

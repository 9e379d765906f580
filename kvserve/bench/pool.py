"""``kvserve bench pool``: KV pool transfer speed against memcpy, on one machine.

Starts its own ``mooncake_master`` on free loopback ports and one pool member, then for
every object size and batch size (skipping batches over ``--max-batch-mib``):

- put GB/s: ``batch_put_from`` of fresh keys straight from a registered source buffer;
- get GB/s: ``batch_get_into`` of those keys straight into a registered, preallocated
  target buffer (the bytes are checked against the source after the timing);
- memcpy GB/s: a copy of the same bytes between the same two preallocated buffers, in the
  same repetition: the baseline. Ratios are pool / memcpy.

Also lookup ops/s: batched existence checks of 512 keys. Medians over ``--repeat``.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar

import numpy as np

from kvpool.store import MooncakeStore
from kvserve.bench.common import median_seconds, ratio_headline, scratch_pool
from kvserve.report import emit, log, median
from kvserve.settings import BENCH_ENV, setting

KIB = 1024


@dataclass(frozen=True)
class PoolBenchConfig:
    """The transfers of ``kvserve bench pool``.

    - ``sizes_kib``: block sizes to put and get;
    - ``batches``: blocks per batched call;
    - ``max_batch_mib``: skip size x batch combinations above this many MiB;
    - ``repeat``: runs per measurement (the median is reported);
    - ``seed``: seed of the random data.
    """

    env_prefix: ClassVar[str] = BENCH_ENV
    sizes_kib: list[int] = setting([16, 64, 256, 1024, 4096])
    batches: list[int] = setting([1, 4, 16, 64, 256])
    max_batch_mib: int = 256
    repeat: int = 3
    seed: int = 0


SETTINGS = (PoolBenchConfig,)


def _one(
    store: MooncakeStore, src: np.ndarray, dst: np.ndarray, size: int, batch: int, tag: str
) -> dict[str, float]:
    keys = [f"bench/{tag}/{i}" for i in range(batch)]
    base_s, base_d = src.ctypes.data, dst.ctypes.data
    ptrs_s = [base_s + i * size for i in range(batch)]
    ptrs_d = [base_d + i * size for i in range(batch)]
    nbytes = size * batch
    t0 = time.perf_counter()
    codes = store.put_from(keys, ptrs_s, [size] * batch)
    t1 = time.perf_counter()
    got = store.get_into(keys, ptrs_d, [size] * batch)
    t2 = time.perf_counter()
    if any(c != 0 for c in codes) or any(g != size for g in got):
        raise RuntimeError(f"pool transfer failed: put {set(codes)}, get {set(got)}")
    if not np.array_equal(src[:nbytes], dst[:nbytes]):
        raise RuntimeError("bytes read back differ from the bytes written")
    dst[:nbytes] = 0
    t3 = time.perf_counter()
    np.copyto(dst[:nbytes], src[:nbytes])
    t4 = time.perf_counter()
    store.remove(keys)
    return {
        "put": nbytes / (t1 - t0) / 1e9,
        "get": nbytes / (t2 - t1) / 1e9,
        "memcpy": nbytes / (t4 - t3) / 1e9,
    }


def _lookups(store: MooncakeStore, n: int = 512, reps: int = 20) -> float:
    keys = [f"bench/lookup/{i}" for i in range(n)]
    return n / median_seconds(partial(store.exists, keys), reps, warmup=False)


def run(args: argparse.Namespace) -> int:
    sizes = [s * KIB for s in args.sizes_kib]
    cap = args.max_batch_mib << 20
    results: list[dict[str, Any]] = []
    with scratch_pool(2 * args.max_batch_mib + 64) as (_, pool):
        store = MooncakeStore.connect(dataclasses.replace(pool, pool_local_buffer_mib=64))
        src = np.random.default_rng(args.seed).integers(0, 256, cap, dtype=np.uint8)
        dst = np.zeros(cap, dtype=np.uint8)
        for buf in (src, dst):
            store.register(buf.ctypes.data, buf.nbytes)
        try:
            for size in sizes:
                for batch in args.batches:
                    if size * batch > cap:
                        continue
                    runs = [
                        _one(store, src, dst, size, batch, f"{size}-{batch}-{r}")
                        for r in range(args.repeat)
                    ]
                    row = {"object_kib": size // KIB, "batch": batch}
                    for k in ("put", "get", "memcpy"):
                        row[f"{k}_gb_s"] = round(median([r[k] for r in runs]), 3)
                    row["get_vs_memcpy"] = round(row["get_gb_s"] / row["memcpy_gb_s"], 3)
                    row["put_vs_memcpy"] = round(row["put_gb_s"] / row["memcpy_gb_s"], 3)
                    log(f"{row}")
                    results.append(row)
            lookup_rate = _lookups(store)
        finally:
            for buf in (src, dst):
                store.unregister(buf.ctypes.data)
            store.close()
    target_rows = [r for r in results if r["object_kib"] == 1024]
    best = max(target_rows, key=lambda r: r["get_vs_memcpy"]) if target_rows else {}
    emit(
        "pool",
        {
            "store": "Mooncake Store (mooncake-transfer-engine), one member, loopback",
            "protocol": "tcp",
            "object_kib": args.sizes_kib,
            "batches": args.batches,
            "max_batch_mib": args.max_batch_mib,
            "repeat": args.repeat,
            "statistic": "median",
            "baseline": "np.copyto between the same preallocated buffers, same repetition",
            "lookup_keys_per_call": 512,
        },
        [*results, {"lookup_keys_per_s": round(lookup_rate)}],
        ratio_headline(
            "get GB/s at 1 MiB objects (best batch) / same-run memcpy",
            best.get("get_gb_s"),
            best.get("memcpy_gb_s"),
            0.5,
            digits=3,
            batch=best.get("batch"),
        ),
    )
    return 0

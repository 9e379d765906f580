"""``kvserve bench trace --ssd-fraction F``: the pool's SSD tier on a trace replay.

The working set is the distinct blocks of the replayed requests; the DRAM tier is given a
segment that holds ``F`` of it (``pool.segment_mib``: at least the pool's 16 MiB).
The same replay runs twice, each through a fresh ``mooncake_master`` on free loopback
ports: DRAM only, then DRAM + SSD (the master with ``--enable_offload``, the member with
an SSD directory in a temporary folder, removed afterwards, and the offload settings of
:mod:`kvpool.tiers`). Per request, in trace order:

1. ``kvpool.keys.longest_prefix`` over its block chain (one batched existence call): the
   blocks the pool says it has (``lookup_hit_blocks``);
2. those blocks' objects are read back (``get_into`` into one registered buffer): with
   the SSD tier, the master is first asked where each object lives
   (:meth:`kvpool.store.MooncakeStore.tiers`) and the SSD-only objects and the others are
   read in a batch each (:func:`kvpool.tiers.receive_by_tier`), each batch timed; the
   leading blocks read in full are the request's hits (``hit_blocks``, the hit rates);
3. every block after the hits is put as :mod:`.pool` does (layers, then the meta, with
   its retries on a full pool).

Per tier, each request's batch gives one sample of the time to load a block from it
(batch seconds / blocks); the rows give their median and p90. The SSD is whatever disk
holds the temporary folder, behind the page cache.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from kvpool.keys import KeySpace, longest_prefix
from kvpool.master import master_stats
from kvpool.store import MooncakeStore
from kvpool.tiers import TierStats, receive_by_tier
from kvserve.bench.trace.pool import (
    PoolReplay,
    PoolReplaySettings,
    _Writer,
    replay_member,
    segment_mib,
)
from kvserve.sim.trace.replay import TRACE_NAMESPACE, HitCount, TraceRequest

TIERS = ("dram", "ssd")


class _Read(NamedTuple):
    nbytes: int


def working_set(chains: Sequence[Sequence[int]]) -> int:
    """Distinct blocks of the replayed requests."""
    return len({h for chain in chains for h in chain})


def _quantile(samples: list[float], q: float) -> float | None:
    if not samples:
        return None
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


@dataclasses.dataclass
class TierLoads:
    """Per tier, one sample per request batch of the seconds a block took to load."""

    tiers: TierStats = dataclasses.field(default_factory=TierStats)
    samples: dict[str, list[float]] = dataclasses.field(
        default_factory=lambda: {t: [] for t in TIERS}
    )

    def add(self, before: TierStats, objects_per_block: int) -> None:
        """Add the samples of the batches read since the copy ``before``."""
        for tier in TIERS:
            objects = getattr(self.tiers, f"{tier}_objects") - getattr(before, f"{tier}_objects")
            seconds = getattr(self.tiers, f"{tier}_read_seconds") - getattr(
                before, f"{tier}_read_seconds"
            )
            if objects:
                self.samples[tier].append(seconds * objects_per_block / objects)

    def row(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for tier in TIERS:
            s = self.samples[tier]
            out[f"{tier}_objects_read"] = getattr(self.tiers, f"{tier}_objects")
            out[f"{tier}_read_seconds"] = round(getattr(self.tiers, f"{tier}_read_seconds"), 4)
            out[f"{tier}_batches"] = len(s)
            for name, value in (("p50", statistics.median(s) if s else None),
                                ("p90", _quantile(s, 0.9))):  # fmt: skip
                out[f"{tier}_block_load_us_{name}"] = None if value is None else round(value * 1e6)
        return out


class _Reader:
    """Reads blocks' objects back into one registered buffer, a batch per tier."""

    def __init__(self, store: MooncakeStore, buf: np.ndarray, size: int) -> None:
        self.store, self.base, self.size = store, buf.ctypes.data, size

    def _receive(self, names: list[str], slots: list[int]) -> list[_Read]:
        ptrs = [self.base + s * self.size for s in slots]
        return [_Read(n) for n in self.store.get_into(names, ptrs, [self.size] * len(slots))]

    def load(self, keys: KeySpace, hashes: Sequence[int], loads: TierLoads) -> int:
        """Read every object of the blocks ``hashes``; returns the leading blocks read in
        full, and adds the batches to ``loads``."""
        per = 1 + keys.num_layers
        names = [k for h in hashes for k in (keys.meta_key(h), *keys.layer_keys(keys.meta_key(h)))]
        before = dataclasses.replace(loads.tiers)
        tiers = self.store.tiers(names)
        slots = list(range(len(names)))
        got = receive_by_tier(self._receive, tiers, names, slots, self.size, loads.tiers)
        loads.add(before, per)
        full = [g.nbytes == self.size for g in got]
        return next((b for b in range(len(hashes)) if not all(full[b * per : (b + 1) * per])),
                    len(hashes))  # fmt: skip


def ssd_replay(
    requests: Sequence[TraceRequest],
    chains: Sequence[Sequence[int]],
    capacity: int,
    settings: PoolReplaySettings,
    ssd: bool,
    log_dir: Path,
) -> tuple[PoolReplay, TierLoads, int]:
    """One replay (see the module docstring) on a DRAM tier of about ``capacity`` blocks,
    with an SSD tier if ``ssd``; returns the replay, the loads per tier and the blocks
    the lookups found."""
    keys = KeySpace.of(TRACE_NAMESPACE, settings.layers)
    mib = segment_mib(capacity, settings.objects_per_block, settings.block_bytes)
    longest = max((len(c) for c in chains), default=1)
    hits, loads, found, failed = HitCount(), TierLoads(), 0, 0
    name = f"{'ssd' if ssd else 'dram'}-{capacity}"
    with (
        tempfile.TemporaryDirectory(prefix="kvserve-ssd-") as tmp,
        replay_member(settings, mib, longest, log_dir, name, tmp if ssd else "") as member,
    ):
        cfg, store, buf = member
        reader = _Reader(store, buf, settings.block_bytes)
        writer = _Writer(store, buf, settings)
        t0 = time.perf_counter()
        for request, chain in zip(requests, chains, strict=True):
            present = longest_prefix(store, keys, list(chain))
            found += present
            hit = reader.load(keys, chain[:present], loads)
            hits.add(request, hit)
            failed += len(writer.put_blocks(keys, chain[hit:]))
        seconds = time.perf_counter() - t0
        stats = master_stats(cfg)
    replay = PoolReplay(hits, mib, stats, writer.objects, writer.retries, failed, seconds)
    return replay, loads, found


def ssd_rows(
    requests: Sequence[TraceRequest],
    chains: Sequence[Sequence[int]],
    args: argparse.Namespace,
    log_dir: Path,
) -> list[dict[str, Any]]:
    """The DRAM-only and the DRAM + SSD rows at ``args.ssd_fraction`` of the working set."""
    if not 0 < args.ssd_fraction <= 1:
        raise ValueError(f"ssd-fraction must be in (0, 1], got {args.ssd_fraction}")
    settings = PoolReplaySettings(
        args.block_bytes,
        args.layers,
        args.eviction_high_watermark,
        args.eviction_ratio,
        args.put_retries,
    )
    blocks = working_set(chains)
    capacity = max(1, round(args.ssd_fraction * blocks))
    rows: list[dict[str, Any]] = []
    for ssd in (False, True):
        replay, loads, found = ssd_replay(requests, chains, capacity, settings, ssd, log_dir)
        rows.append(
            {
                "section": "ssd",
                "tiers": "dram+ssd" if ssd else "dram",
                "working_set_blocks": blocks,
                "dram_capacity_blocks": capacity,
                "lookup_hit_blocks": found,
                **replay.row(settings),
                **loads.row(),
            }
        )
    return rows


def ssd_headline(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """DRAM + SSD token hit rate against DRAM only, and the median block load per tier."""
    by = {r["tiers"]: r for r in rows if r.get("section") == "ssd"}
    dram, both = by["dram"], by["dram+ssd"]
    return {
        "metric": "token hit rate, DRAM + SSD / DRAM only, DRAM = ssd_fraction of the working set",
        "value": both["token_hit_rate"],
        "baseline": dram["token_hit_rate"],
        "ratio": round(both["token_hit_rate"] / dram["token_hit_rate"], 3)
        if dram["token_hit_rate"]
        else None,
        "dram_block_load_us_p50": both["dram_block_load_us_p50"],
        "ssd_block_load_us_p50": both["ssd_block_load_us_p50"],
    }

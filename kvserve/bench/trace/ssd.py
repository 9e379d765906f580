"""``kvserve bench trace --ssd-fraction F``: the pool's SSD tier on a trace replay.

The working set is the distinct blocks of the replayed requests; the DRAM tier is given a
segment that holds ``F`` of it (at least the pool's 16 MiB). The same replay runs twice,
each through a fresh ``mooncake_master`` on free loopback ports (:func:`.pool.pool_replay`):
DRAM only, then DRAM + SSD (the master with ``--enable_offload``, the member with an SSD
directory in a temporary folder, removed afterwards, and the offload settings of
:mod:`kvpool.tiers`). Per request, in trace order:

1. ``kvpool.keys.longest_prefix`` over its block chain (one batched existence call): the
   blocks the pool says it has (``lookup_hit_blocks``);
2. those blocks' objects are read back (``get_into`` into one registered buffer): with
   the SSD tier, the master is first asked where each object lives
   (:meth:`kvpool.store.MooncakeStore.tiers`) and the SSD-only objects and the others are
   read in a batch each (:func:`kvpool.tiers.receive_by_tier`), each batch timed; the
   leading blocks read in full are the request's hits (``hit_blocks``, the hit rates);
3. every block after the hits is put as :mod:`.pool` does (layers, then the meta, with
   its retries on a full pool). Both replays retry at least :func:`offload_retries` times:
   with offload on, a full DRAM tier refuses puts until the offload heartbeat has written
   out the objects it pinned (:mod:`kvpool.tiers`). With the replay's default 5 retries
   (0.3 s of backoff against a 1 s heartbeat) 1,497 of 2,631 blocks were never stored and
   DRAM + SSD hit fewer tokens than DRAM alone (0.6% against 3.7%,
   ``--ssd-fraction 0.3 --max-requests 100``); with 9, 3.9% against 3.7%.

Per tier, each request's batch gives one sample of the time to load a block from it
(batch seconds / blocks); the rows give their median and p90. The SSD is whatever disk
holds the temporary folder, behind the page cache.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from kvpool.keys import KeySpace
from kvpool.store import MooncakeStore
from kvpool.tiers import HEARTBEAT_VARIABLE, TierStats, offload_setting, receive_by_tier
from kvserve.bench.trace.pool import FIRST_BACKOFF_S, PoolReplaySettings, pool_replay
from kvserve.sim.trace.replay import Trace

TIERS = ("dram", "ssd")


def offload_retries(put_retries: int) -> int:
    """``put_retries``, or more where needed for the doubling backoff of a failed put
    (:data:`~kvserve.bench.trace.pool.FIRST_BACKOFF_S` first) to wait out two offload
    heartbeats in all (the member's, :func:`kvpool.tiers.offload_setting`; at the default
    of 1 s, 9 retries)."""
    heartbeat = float(offload_setting(HEARTBEAT_VARIABLE))
    return max(put_retries, math.ceil(math.log2(2 * heartbeat / FIRST_BACKOFF_S + 1)))


class _Read(NamedTuple):
    nbytes: int


def working_set(chains: Sequence[Sequence[int]]) -> int:
    """Distinct blocks of the replayed requests."""
    return len({h for chain in chains for h in chain})


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

    def read(
        self, store: MooncakeStore, base: int, size: int, keys: KeySpace, hashes: Sequence[int]
    ) -> int:
        """Read every object (``size`` bytes each) of the blocks ``hashes`` into the
        registered buffer at ``base`` (step 2 of the module docstring); returns the leading
        blocks read in full."""
        per = 1 + keys.num_layers
        names = [k for h in hashes for k in (keys.meta_key(h), *keys.layer_keys(keys.meta_key(h)))]

        def receive(batch: list[str], slots: list[int]) -> list[_Read]:
            ptrs = [base + s * size for s in slots]
            return [_Read(n) for n in store.get_into(batch, ptrs, [size] * len(slots))]

        before = dataclasses.replace(self.tiers)
        slots = list(range(len(names)))
        got = receive_by_tier(receive, store.tiers(names), names, slots, size, self.tiers)
        self.add(before, per)
        full = [g.nbytes == size for g in got]
        short = (b for b in range(len(hashes)) if not all(full[b * per : (b + 1) * per]))
        return next(short, len(hashes))

    def row(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for tier in TIERS:
            s = sorted(self.samples[tier])
            out[f"{tier}_objects_read"] = getattr(self.tiers, f"{tier}_objects")
            out[f"{tier}_read_seconds"] = round(getattr(self.tiers, f"{tier}_read_seconds"), 4)
            out[f"{tier}_batches"] = len(s)
            p90 = s[min(len(s) - 1, math.ceil(0.9 * len(s)) - 1)] if s else None  # nearest rank
            for name, value in (("p50", statistics.median(s) if s else None), ("p90", p90)):
                out[f"{tier}_block_load_us_{name}"] = None if value is None else round(value * 1e6)
        return out


def ssd_rows(
    trace: Trace, fraction: float, settings: PoolReplaySettings, log_dir: Path
) -> list[dict[str, Any]]:
    """Section ``ssd``: the DRAM-only and the DRAM + SSD rows of ``trace`` at ``fraction``
    of its working set."""
    if not 0 < fraction <= 1:
        raise ValueError(f"ssd-fraction must be in (0, 1], got {fraction}")
    blocks = working_set(trace.chains)
    capacity = max(1, round(fraction * blocks))
    settings = dataclasses.replace(settings, put_retries=offload_retries(settings.put_retries))
    rows: list[dict[str, Any]] = []
    for ssd in (False, True):
        loads = TierLoads()
        replay = pool_replay(
            trace.requests, trace.chains, capacity, settings, log_dir, loads.read, ssd
        )
        rows.append(
            {
                "section": "ssd",
                "tiers": "dram+ssd" if ssd else "dram",
                "working_set_blocks": blocks,
                "dram_capacity_blocks": capacity,
                "lookup_hit_blocks": replay.lookup_hit_blocks,
                **replay.row(settings),
                **loads.row(),
            }
        )
    return rows


def ssd_headline(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """DRAM + SSD token hit rate against DRAM only, and the median block load per tier."""
    by = {r["tiers"]: r for r in rows if r.get("section") == "ssd"}
    dram, both = by["dram"]["token_hit_rate"], by["dram+ssd"]
    return {
        "metric": "token hit rate, DRAM + SSD / DRAM only, DRAM = ssd_fraction of the working set",
        "value": both["token_hit_rate"],
        "baseline": dram,
        "ratio": round(both["token_hit_rate"] / dram, 3) if dram else None,
        "dram_block_load_us_p50": both["dram_block_load_us_p50"],
        "ssd_block_load_us_p50": both["ssd_block_load_us_p50"],
    }

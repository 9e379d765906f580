"""The pool's SSD tier: Mooncake Store's own SSD offload, and where each read was served.

With ``pool_ssd_dir`` set (and the master run with ``master_enable_offload``), a member
keeps offloaded copies of the objects of its segment in that directory; a read of an
object that DRAM evicted is served from there (through the owner's offload RPC server,
even inside one process). Mooncake reads its offload settings from ``MOONCAKE_OFFLOAD_*``
environment variables when a client joins: :func:`offload_environment` sets the ones whose
defaults do not fit a small pool (:data:`OFFLOAD_DEFAULTS`), unless the operator already
set them.

Contracts:

- With offload on, a put to a full DRAM tier fails with :data:`NO_SPACE` until the
  offload heartbeat has written the pinned objects out (about :data:`OFFLOAD_DEFAULTS`'
  heartbeat interval): a cache miss for the writer ("not committed"), never an outage.
- :func:`replica_tiers` asks the master where each object lives (one batched RPC; it also
  refreshes the objects' leases, as any read does). Only a pool with an SSD tier pays it.
- :func:`receive_by_tier` reads DRAM-resident objects and SSD-only ones in separate
  batches, timed apart, and adds them to :class:`TierStats`; the result is in the callers'
  order. SSD reads are staged in the owner's offload buffer
  (``MOONCAKE_OFFLOAD_LOCAL_BUFFER_SIZE_BYTES``): a batch larger than it fails as a whole
  (every key -10, seen on 0.3.13.post1 with 80 MiB against 64 MiB), so SSD batches are cut
  to half of it (:func:`ssd_batch_objects`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Protocol, TypeVar

NO_SPACE = -200
"""The binding's ``NO_AVAILABLE_HANDLE``: no room in DRAM now (eviction or the offload
heartbeat is catching up). Not an outage."""

HEARTBEAT_VARIABLE = "MOONCAKE_OFFLOAD_HEARTBEAT_INTERVAL_SECONDS"
BUFFER_VARIABLE = "MOONCAKE_OFFLOAD_LOCAL_BUFFER_SIZE_BYTES"
OFFLOAD_DEFAULTS: dict[str, str] = {
    HEARTBEAT_VARIABLE: "1",
    BUFFER_VARIABLE: str(64 << 20),
    "MOONCAKE_OFFLOAD_STORAGE_BACKEND_DESCRIPTOR": "file_per_key_storage_backend",
}
"""Mooncake's offload variables and the values set when they are unset: a 1 s heartbeat
(Mooncake's 10 s stalls puts on a full DRAM tier for up to 10 s), a 64 MiB read staging
buffer (Mooncake's 1.25 GiB is most of a small machine), and one file per object (the
default bucket backend holds objects back until 500 of them or 256 MiB are pending, so a
small pool would evict them before they reach the disk)."""


def offload_setting(name: str) -> str:
    """The value of the offload variable ``name`` (a key of :data:`OFFLOAD_DEFAULTS`) that a
    member joining now runs with: the environment's, else the default that
    :func:`offload_environment` sets."""
    return os.environ.get(name, OFFLOAD_DEFAULTS[name])


def ssd_batch_objects(size: int) -> int:
    """Objects of ``size`` bytes per SSD read batch: half the offload staging buffer."""
    buffer = int(offload_setting(BUFFER_VARIABLE))
    return max(1, buffer // 2 // max(1, size))


def offload_environment() -> dict[str, str]:
    """Set :data:`OFFLOAD_DEFAULTS` where unset; returns the offload variables in effect."""
    for name, value in OFFLOAD_DEFAULTS.items():
        os.environ.setdefault(name, value)
    return {k: v for k, v in os.environ.items() if k.startswith("MOONCAKE_OFFLOAD_")}


def prepare_ssd_dir(path: str) -> str:
    """``path`` created if missing and resolved (Mooncake refuses a symlink); raises
    ``OSError`` with a message naming the setting when it cannot be used."""
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
        real = os.path.realpath(path)
        if not os.access(real, os.W_OK | os.X_OK):
            raise PermissionError(f"{real} is not writable")
    except OSError as exc:
        raise OSError(f"pool_ssd_dir {path!r} cannot be used for the SSD tier: {exc}") from exc
    return real


class Tier(Enum):
    """Where an object is served from: a DRAM replica wins over the SSD copy."""

    DRAM = "dram"
    SSD = "ssd"
    NONE = "none"


def replica_tiers(client: Any, keys: Sequence[str]) -> list[Tier]:
    """Per key, the tier a read of it would be served from now (one batched RPC to the
    master; racy: an eviction may move it before the read)."""
    found = client.batch_get_replica_desc(list(keys))
    out: list[Tier] = []
    for key in keys:
        replicas = found.get(key) or []
        if any(r.is_memory_replica() for r in replicas):
            out.append(Tier.DRAM)
        elif any(r.is_local_disk_replica() for r in replicas):
            out.append(Tier.SSD)
        else:
            out.append(Tier.NONE)
    return out


@dataclass
class TierStats:
    """Objects read in full from each tier and the time their batches took (zero without
    an SSD tier)."""

    dram_objects: int = 0
    ssd_objects: int = 0
    dram_read_seconds: float = 0.0
    ssd_read_seconds: float = 0.0


class _Received(Protocol):
    @property
    def nbytes(self) -> int: ...


R = TypeVar("R", bound=_Received)
S = TypeVar("S")


def receive_by_tier(
    receive: Callable[[list[str], list[S]], Sequence[R]],
    tiers: Sequence[Tier],
    keys: Sequence[str],
    spans: Sequence[S],
    size: int,
    stats: TierStats,
) -> list[R]:
    """``receive(keys, spans)`` by tier: the SSD-only objects first, in batches of
    :func:`ssd_batch_objects`, then the rest (DRAM or absent) in one, each timed into
    ``stats``; results in the order of ``keys``."""
    ssd = [i for i, t in enumerate(tiers) if t is Tier.SSD]
    rest = [i for i, t in enumerate(tiers) if t is not Tier.SSD]
    step = ssd_batch_objects(size)
    batches = [(Tier.SSD, ssd[i : i + step]) for i in range(0, len(ssd), step)]
    out: list[R | None] = [None] * len(keys)
    for tier, idx in [*batches, (Tier.DRAM, rest)]:
        if not idx:
            continue
        t0 = time.perf_counter()
        got = receive([keys[i] for i in idx], [spans[i] for i in idx])
        seconds = time.perf_counter() - t0
        full = sum(1 for g in got if g.nbytes == size)
        if tier is Tier.SSD:
            stats.ssd_objects += full
            stats.ssd_read_seconds += seconds
        else:
            stats.dram_objects += full
            stats.dram_read_seconds += seconds
        for i, g in zip(idx, got, strict=True):
            out[i] = g
    return [g for g in out if g is not None]

"""Direct push: one pool member writes KV spans straight into another member's reserved pages.

The decode side needs nothing new: its KV slab is already registered with its pool client
(:class:`kvpool.span_io.DirectIO`), whose transfer engine serves it under the client's
segment name (:meth:`kvpool.store.MooncakeStore.segment`). It describes the pages it holds
for one prompt as a :class:`PushTarget`. The pushing side (a prefill worker) starts one
:class:`PushEngine` per process, on first use: a Mooncake ``TransferEngine`` of its own
(named ``<pool_local_hostname>:<free port>``, unique as the metadata server requires) with
its own slab registered, which writes spans into the target's segment
(``batch_transfer_sync_write``). Its listeners come from the same Mooncake library as the
pool client's, so :mod:`kvpool.confine` confines them too.

Safety. A target carries a MAC (:func:`target_mac`: HMAC-SHA256 under the pool block key
over the request id and every field), so a pusher writes only where the receiver itself
offered pages for that very request: the router in between, which holds no pool block
key, can relay a target but neither forge nor alter one. :func:`target_error` checks the
MAC and the target against the pusher's own layout before any write: same wire layout,
pages inside the target's slab and distinct, one page per block from ``first_block`` to
the prompt's last block. The target's transfer engine refuses writes outside its
registered buffers. Within its slab it cannot tell pages apart, so the
receiver never trusts a push: it checks each block of its own reservation against a meta
MAC'd under the pool block key (:mod:`kvpool.meta`) over the digests of its own pages, and
keeps a reservation's pages out of use for a while after it ended unadopted (a push may
still be on its way: ``workers.handoff.reservations.PUSH_QUARANTINE_S``).

Lifecycle: ``PushEngine.start(config, regions)`` -> :meth:`PushEngine.write` (any thread,
one at a time per engine) -> :meth:`PushEngine.close`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvpool.config import PoolConfig
from kvpool.layout import KVLayout
from kvpool.net import free_local_ports
from kvpool.store import transfer_environment

log = logging.getLogger(__name__)

NAME_TRIES = 4
"""Segment names tried before starting an engine is given up (another process may have
taken the port label meanwhile: the metadata server refuses a duplicate name)."""
MAX_SEGMENT_CHARS = 256
MAX_ADDRESS = (1 << 64) - 1
MAX_CLOCK_SKEW_MS = 5000
"""How far ahead of this host's clock a target's issue time may be (two hosts' clocks)."""


@dataclass(frozen=True)
class PushTarget:
    """Where a decode worker holds one prompt's pages (mirrors ``proto`` ``PushTarget``):
    block ``first_block + i`` of the prompt goes to page ``pages[i]`` of the slab at
    ``slab_address`` in ``segment`` (``num_blocks`` pages of layout ``wire``); writes may
    come for ``lease_s`` seconds from ``issued_ms`` (Unix milliseconds, when the receiver
    made it), and a pusher uses it once (:class:`workers.handoff.pusher.Pusher`)."""

    segment: str
    wire: str
    slab_address: int
    num_blocks: int
    first_block: int
    pages: tuple[int, ...]
    lease_s: float
    issued_ms: int = 0
    mac: str = ""
    """:func:`target_mac` of this target for its request, by the receiver."""

    def layout(self, own: KVLayout) -> KVLayout:
        """The target's slab layout: ``own`` (whose wire it shares) with its page count."""
        return KVLayout(
            num_layers=own.num_layers,
            num_blocks=self.num_blocks,
            block_tokens=own.block_tokens,
            kv_heads=own.kv_heads,
            head_dim=own.head_dim,
            dtype=own.dtype,
        )


def target_mac(block_key: bytes, request_id: str, target: PushTarget) -> str:
    """HMAC-SHA256 under ``block_key`` of ``request_id`` and every field of ``target`` but
    its ``mac`` (the lease in whole milliseconds, as the wire carries it, and the issue
    time: a target cannot be made younger)."""
    fields = [
        "push",
        request_id,
        target.segment,
        target.wire,
        target.slab_address,
        target.num_blocks,
        target.first_block,
        list(target.pages),
        round(target.lease_s * 1000),
        target.issued_ms,
    ]
    text = json.dumps(fields, separators=(",", ":"))
    return hmac.new(block_key, text.encode(), hashlib.sha256).hexdigest()


def lease_left_s(target: PushTarget, now_ms: int | None = None) -> float:
    """Seconds of ``target``'s lease left at ``now_ms`` (default: now), counted from when
    it was issued, not from when it arrived (<= 0: over)."""
    now_ms = time_ms() if now_ms is None else now_ms
    return (target.issued_ms + round(target.lease_s * 1000) - now_ms) / 1000


def time_ms() -> int:
    """Now, in Unix milliseconds (the clock of :attr:`PushTarget.issued_ms`)."""
    return int(time.time() * 1000)


def target_error(
    target: PushTarget,
    own: KVLayout,
    num_prompt_tokens: int,
    request_id: str,
    block_key: bytes,
    now_ms: int | None = None,
) -> str | None:
    """Why ``target`` cannot take ``request_id``'s push of a ``num_prompt_tokens`` prompt
    from a pool member of layout ``own`` and pool block key ``block_key`` at ``now_ms``
    (default: now), or ``None``: checked before anything is written. A target issued more
    than :data:`MAX_CLOCK_SKEW_MS` ahead of this clock is refused with the expired ones: a
    replayed target is refused once its lease, counted from its issue, is over."""
    blocks = -(-num_prompt_tokens // own.block_tokens)
    segment = target.segment
    expected = target_mac(block_key, request_id, target)
    if not hmac.compare_digest(target.mac.encode(), expected.encode()):
        return "its MAC does not verify (not made by a pool member for this request)"
    if not segment or len(segment) > MAX_SEGMENT_CHARS or not segment.isprintable():
        return "bad segment name"
    if target.wire != own.wire:
        return f"layout {target.wire!r} differs from this worker's {own.wire!r}"
    if target.num_blocks < 1 or target.slab_address < 1:
        return "empty slab"
    if target.slab_address + target.layout(own).slab_bytes > MAX_ADDRESS:
        return "slab past the address space"
    if not 0 <= target.first_block < blocks or len(target.pages) != blocks - target.first_block:
        return f"{len(target.pages)} pages from block {target.first_block} for {blocks} blocks"
    if any(not 0 <= p < target.num_blocks for p in target.pages):
        return "a page outside the slab"
    if len(set(target.pages)) != len(target.pages):
        return "two blocks on one page"
    if not target.lease_s > 0:
        return "no lease"
    now_ms = time_ms() if now_ms is None else now_ms
    if target.issued_ms > now_ms + MAX_CLOCK_SKEW_MS:
        return "issued in the future (are the two hosts' clocks in sync?)"
    if lease_left_s(target, now_ms) <= 0:
        return "its lease is over (it was issued too long ago: an old target replayed?)"
    return None


def coalesce(
    srcs: Sequence[int], dsts: Sequence[int], size: int
) -> tuple[list[int], list[int], list[int]]:
    """Transfers of ``size`` bytes each (``srcs[i]`` -> ``dsts[i]``) merged where both sides
    run on contiguously: ``(srcs, dsts, lengths)`` of the fewer, larger transfers."""
    out_s: list[int] = []
    out_d: list[int] = []
    lens: list[int] = []
    for s, d in zip(srcs, dsts, strict=True):
        if lens and out_s[-1] + lens[-1] == s and out_d[-1] + lens[-1] == d:
            lens[-1] += size
        else:
            out_s.append(s)
            out_d.append(d)
            lens.append(size)
    return out_s, out_d, lens


@dataclass(frozen=True)
class PushOutcome:
    """How a push went (mirrors ``proto`` ``PushResult``): ``metas[i]`` is the meta object
    of block ``first_block + i`` when ``ok``; ``error`` says why not otherwise. ``bytes``
    and ``seconds``: the KV its last step pushed after the first token was answered (not
    in that token's usage)."""

    ok: bool
    metas: list[bytes]
    error: str = ""
    bytes: int = 0
    seconds: float = 0.0


class PushError(RuntimeError):
    """A push could not be made (engine start, registration, or the transfer refused)."""


class PushEngine:
    """One process's transfer engine for pushes (see the module docstring)."""

    def __init__(self, engine: Any, name: str, regions: list[tuple[int, int]]) -> None:
        self._engine = engine
        self.name = name
        """This engine's own segment name (unique in the pool's metadata server)."""
        self._regions = regions
        self._lock = threading.Lock()

    @classmethod
    def start(cls, config: PoolConfig, regions: list[tuple[int, int]]) -> PushEngine:
        """An engine in ``config``'s pool (its metadata server and protocol) with
        ``regions`` (``(address, bytes)``: the memory pushes are made from) registered;
        :class:`PushError` if it cannot be had."""
        try:
            from mooncake.engine import TransferEngine
        except ImportError as exc:
            raise PushError(f"cannot import mooncake.engine: {exc}") from exc
        transfer_environment(config)
        host = config.pool_local_hostname
        for _ in range(NAME_TRIES):
            name = f"{host}:{free_local_ports(1)[0]}"
            engine = TransferEngine()
            rc = engine.initialize(
                name, config.metadata_server, config.pool_protocol, config.pool_rdma_devices
            )
            if rc == 0:
                break
            log.warning("starting a push engine as %s failed (%s); trying another name", name, rc)
        else:
            raise PushError(f"no push engine could be started in {config.metadata_server}")
        for address, size in regions:
            if (rc := engine.register_memory(address, size)) != 0:
                raise PushError(f"registering {size} bytes for pushes failed ({rc})")
        return cls(engine, name, regions)

    def write(self, segment: str, srcs: Sequence[int], dsts: Sequence[int], size: int) -> bool:
        """Write ``size`` bytes from each ``srcs[i]`` (registered here) to ``dsts[i]`` in
        ``segment``; True once all landed, False if the target refused or is gone."""
        if not srcs:
            return True
        merged = coalesce(srcs, dsts, size)
        with self._lock:
            rc = self._engine.batch_transfer_sync_write(segment, *merged)
        return int(rc) == 0

    def close(self) -> None:
        """Unregister the memory; the engine goes with its last reference."""
        with self._lock:
            for address, _ in self._regions:
                self._engine.unregister_memory(address)
            self._regions = []

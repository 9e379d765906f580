"""A typed, narrow wrapper over the Mooncake Store client.

Everything the pool does goes through these verbs, so the rest of ``kvpool`` never touches
the binding directly. Lifecycle: :meth:`MooncakeStore.connect` (joins the pool: contributes
``pool_segment_mib`` of this process's memory, mounts it at the master) -> ``register`` the
memory that objects are moved from and into (zero-copy) -> batch verbs -> :meth:`close`.

Return conventions follow the binding: puts give 0 or a negative error per key, gets give
the bytes read or a negative error, existence gives 1, 0, or -1 (error).

Outages (the master killed or restarting): a verb that fails while the master is gone
opens a breaker (:mod:`kvpool.breaker`): until a probe finds the pool back, every verb
answers "failed" at once without calling the binding. :attr:`MooncakeStore.outages` counts
outages, :attr:`MooncakeStore.available` says whether the pool is usable now. A put refused
for want of space (:data:`kvpool.tiers.NO_SPACE`) is a failed put, never an outage.

SSD tier (``pool_ssd_dir``, :mod:`kvpool.tiers`): ``connect`` creates the directory, sets
Mooncake's offload variables and joins with offload on; :attr:`MooncakeStore.ssd` says so,
and :meth:`MooncakeStore.tiers` tells where objects would be read from.

A member that does not answer a read (its host cut off) has what only it holds skipped by
later reads for a while (:mod:`kvpool.peers`), instead of stalling each of them up to 60 s.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import os
import threading
import time
from typing import Any, TypeVar

from kvpool.breaker import MASTER_PROBE_S, OutageBreaker
from kvpool.config import PoolConfig
from kvpool.net import port_open
from kvpool.peers import TRANSFER_FAIL, UnreachablePeers
from kvpool.tiers import Tier, offload_environment, prepare_ssd_dir, replica_tiers

log = logging.getLogger(__name__)

TRANSFER_ADDRESS_VARIABLE = "MC_TCP_BIND_ADDRESS"
"""Mooncake's own variable for the address its TCP transport advertises to the other members
(despite the name, it binds nothing: :mod:`kvpool.confine` does that); set from
``pool_local_hostname`` before each join."""
TRANSFER_TIMEOUT_VARIABLES = ("MC_TCP_PROGRESS_TIMEOUT_SEC", "MC_TCP_STATUS_TIMEOUT_SEC")
"""Mooncake's TCP transport's stall limits (whole seconds), set from
``pool_transfer_timeout_s`` before each join (:func:`transfer_environment`)."""
READERS = 4
"""Threads that run value reads (:meth:`MooncakeStore.get_bytes`), so a read can be given up
while its call goes on: a read given up holds one until the binding ends it (at most 60 s)."""
FAILED = -1


class PoolUnavailableError(RuntimeError):
    """The pool cannot be joined or reached; callers fall back to recomputing."""


def check_master(config: PoolConfig) -> tuple[str, int] | None:
    """The single master ``config`` names, as ``(host, port)``, once its port answers
    within :data:`MASTER_PROBE_S` (``None`` for masters in HA mode, found through etcd);
    raises :class:`PoolUnavailableError` when nothing answers there. Mooncake's own setup
    retries for about 90 s before giving up, and a vLLM worker would load its model first:
    this answers in seconds."""
    host, _, port = config.pool_master.rpartition(":")
    if not port.isdigit() or config.ha_master:
        return None
    master = (host.strip("[]"), int(port))
    if not port_open(*master, MASTER_PROBE_S):
        raise PoolUnavailableError(
            f"nothing answers at {config.pool_master}: is mooncake_master running there?"
        )
    return master


def transfer_environment(config: PoolConfig) -> None:
    """Set the variables Mooncake's transfer engine reads when it starts from ``config``:
    the address it advertises and how long a stalled transfer lasts."""
    # Mooncake advertises its transfer-engine address from this variable, else from the
    # machine's first LAN interface, whatever the local hostname says: make it say ours.
    os.environ[TRANSFER_ADDRESS_VARIABLE] = config.pool_local_hostname
    seconds = str(max(1, math.ceil(config.pool_transfer_timeout_s)))
    os.environ.update(dict.fromkeys(TRANSFER_TIMEOUT_VARIABLES, seconds))


T = TypeVar("T")


def _pick(seq: list[T], tried: list[int]) -> list[T]:
    """The entries of ``seq`` at ``tried`` (``seq`` itself when every key is tried, the
    usual case: no copy on the read path)."""
    return seq if len(tried) == len(seq) else [seq[i] for i in tried]


def _in_key_order(n: int, tried: list[int], got: list[T], missing: T) -> list[T]:
    """``got`` (one answer per index in ``tried``) as ``n`` answers in key order,
    ``missing`` for the keys not tried."""
    if len(tried) == n:
        return got
    read = dict(zip(tried, got, strict=True))
    return [read.get(i, missing) for i in range(n)]


class MooncakeStore:
    def __init__(
        self,
        client: Any,
        master: tuple[str, int] | None = None,
        ssd: bool = False,
        transfer_timeout_s: float = PoolConfig.pool_transfer_timeout_s,
    ) -> None:
        self._client = client
        self.ssd = ssd
        """Whether this member joined with an SSD tier (offloads and reads back from it)."""
        self.breaker = OutageBreaker(self.healthy, master)
        """Opened by an outage (:mod:`kvpool.breaker`); ``master`` is probed to close it."""
        self.peers = UnreachablePeers(client)
        """Members whose transfers failed lately (:mod:`kvpool.peers`)."""
        self.transfer_timeout_s = transfer_timeout_s
        """``pool_transfer_timeout_s``: a read lasting this long found a member silent."""
        self.give_up_s = 2 * transfer_timeout_s
        """A value read still running after this long is given up (:meth:`get_bytes`)."""
        self.given_up = 0
        """Value reads given up (:meth:`get_bytes`, which several threads call)."""
        self._counting = threading.Lock()
        self._readers = concurrent.futures.ThreadPoolExecutor(READERS, "kvpool-read")

    @property
    def available(self) -> bool:
        """Whether the pool can be used now (:meth:`OutageBreaker.allows`)."""
        return self.breaker.allows()

    @property
    def breaker_open(self) -> bool:
        """Whether an outage was seen and the pool not found back yet (no probe, no RPC)."""
        return self.breaker.open

    @property
    def outages(self) -> int:
        """Outages seen since start (each opened the breaker once)."""
        return self.breaker.outages

    @classmethod
    def connect(cls, config: PoolConfig) -> MooncakeStore:
        """Join the pool described by ``config``; raises :class:`PoolUnavailableError`."""
        try:
            from mooncake.store import MooncakeDistributedStore
        except ImportError as exc:  # missing wheel or missing libibverbs1
            raise PoolUnavailableError(
                f"cannot import mooncake.store ({exc}): the pool needs Mooncake Store, "
                "kvserve's pool-cpu extra (pool-cuda on a GPU machine), and Debian's "
                "libibverbs1; scripts/setup.sh installs both"
            ) from exc
        master = check_master(config)
        transfer_environment(config)
        ssd_dir = ""
        if config.pool_ssd_dir:
            try:
                ssd_dir = prepare_ssd_dir(config.pool_ssd_dir)
            except OSError as exc:
                raise PoolUnavailableError(str(exc)) from exc
            offload_environment()
        client = MooncakeDistributedStore()
        rc = client.setup(
            config.pool_local_hostname,
            config.metadata_server,
            config.pool_segment_mib << 20,
            config.pool_local_buffer_mib << 20,
            config.pool_protocol,
            config.pool_rdma_devices,
            config.pool_master,
            None,
            bool(ssd_dir),
            ssd_dir,
        )
        if rc != 0:
            raise PoolUnavailableError(
                f"joining the pool failed (code {rc}): is mooncake_master running at "
                f"{config.pool_master} with its metadata server at {config.metadata_server}? "
                f"(segments under 16 MiB were refused here; this one is "
                f"{config.pool_segment_mib} MiB)"
            )
        return cls(client, master, bool(ssd_dir), config.pool_transfer_timeout_s)

    def register(self, ptr: int, size: int) -> None:
        """Make ``size`` bytes at ``ptr`` a source/target of zero-copy transfers."""
        rc = self._client.register_buffer(ptr, size)
        if rc != 0:
            raise PoolUnavailableError(f"registering {size} bytes with the pool failed ({rc})")

    def unregister(self, ptr: int) -> None:
        self._client.unregister_buffer(ptr)

    def segment(self) -> str:
        """This member's transfer-engine segment name: where another member writes the
        memory registered here directly (:mod:`kvpool.push`)."""
        return str(self._client.get_hostname())

    def put_from(self, keys: list[str], ptrs: list[int], sizes: list[int]) -> list[int]:
        if not keys or not self.available:
            return [FAILED] * len(keys)
        return self.breaker.check(list(self._client.batch_put_from(keys, ptrs, sizes)))

    def upsert_from(self, keys: list[str], ptrs: list[int], sizes: list[int]) -> list[int]:
        """Like :meth:`put_from` but replaces existing objects (a plain put keeps the old)."""
        if not keys or not self.available:
            return [FAILED] * len(keys)
        return self.breaker.check(list(self._client.batch_upsert_from(keys, ptrs, sizes)))

    def get_into(self, keys: list[str], ptrs: list[int], sizes: list[int]) -> list[int]:
        """Read objects into memory: bytes read, or a negative error, per key (those held only
        by an :mod:`unreachable <kvpool.peers>` member fail at once, untried)."""
        if not keys or not self.available:
            return [FAILED] * len(keys)
        tried = self.peers.tryable(keys)
        picked = (_pick(seq, tried) for seq in (keys, ptrs, sizes))
        got = self.breaker.check(list(self._client.batch_get_into(*picked))) if tried else []
        if TRANSFER_FAIL in got:
            self.peers.note(
                [keys[i] for i, c in zip(tried, got, strict=True) if c == TRANSFER_FAIL]
            )
        return _in_key_order(len(keys), tried, got, FAILED)

    def get_bytes(self, keys: list[str]) -> list[bytes]:
        """Values in key order; a missing or failed key gives ``b""`` (as does one held only
        by an unreachable member, untried). The binding gives no error per key here: a call
        that lasted the whole transfer timeout has the members holding its empty keys noted
        as unreachable (a key the master no longer lists names none). A call still running
        after twice the transfer timeout is given up (it ends in the background, on a reader
        thread, :attr:`give_up_s`): every key is a miss, and the members holding them are
        noted (:mod:`kvpool.peers`)."""
        if not keys or not self.available:
            return [b""] * len(keys)
        tried = self.peers.tryable(keys)
        if not tried:
            return [b""] * len(keys)
        picked = _pick(keys, tried)
        t0 = time.monotonic()
        call = self._readers.submit(self._client.get_batch, picked)
        try:
            values = [bytes(v) for v in call.result(timeout=self.give_up_s)]
        except concurrent.futures.TimeoutError:
            call.cancel()  # one no reader took yet (all busy) is dropped
            with self._counting:
                self.given_up += 1
            log.warning(
                "a KV pool read of %d objects did not end within %.1f s: read as misses",
                len(picked), self.give_up_s,
            )  # fmt: skip
            self.peers.note(picked, "held objects of a read given up")
            return [b""] * len(keys)
        if time.monotonic() - t0 >= self.transfer_timeout_s:
            self.peers.note([keys[i] for i, v in zip(tried, values, strict=True) if not v])
        return _in_key_order(len(keys), tried, values, b"")

    def exists(self, keys: list[str]) -> list[int]:
        if not keys or not self.available:
            return [FAILED] * len(keys)
        return self.breaker.check(list(self._client.batch_is_exist(keys)))

    def put_bytes(self, keys: list[str], values: list[bytes]) -> int:
        if not keys or not self.available:
            return FAILED if keys else 0
        return self.breaker.check([int(self._client.put_batch(keys, values))])[0]

    def remove(self, keys: list[str]) -> list[int]:
        """Delete objects (even while leased); 0 per removed key, negative if absent."""
        if not keys or not self.available:
            return [FAILED] * len(keys)
        return list(self._client.batch_remove(keys, True))

    def tiers(self, keys: list[str]) -> list[Tier]:
        """Per key, the tier a read would be served from now (:func:`kvpool.tiers.replica_tiers`;
        one RPC); all :attr:`Tier.DRAM <kvpool.tiers.Tier>` without an SSD tier (no RPC)."""
        if not self.ssd or not keys or not self.available:
            return [Tier.DRAM] * len(keys)
        return replica_tiers(self._client, keys)

    def healthy(self) -> bool:
        return int(self._client.health_check()) == 0

    def close(self) -> None:
        """Leave the pool, once the reads still running have ended (a read given up ends
        within the binding's 60 s). With an SSD tier the client is only dropped: on
        0.3.13.post1 its ``close()`` followed by its destructor crashes the process in the
        offload's shutdown, while the destructor alone unmounts and shuts down cleanly."""
        self._readers.shutdown(wait=True, cancel_futures=True)
        if not self.ssd:
            self._client.close()
        else:
            self._client = None  # no verb may be called after close

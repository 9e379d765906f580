"""How many leading prompt tokens the shared pool holds, asked as a pure pool client.

Lifecycle of :class:`PoolLookup`:

1. ``start()`` joins the pool with no segment of its own (``pool_segment_mib=0``) in a
   daemon thread: the binding blocks, for a minute and more when the master is
   unreachable, and neither start-up nor shutdown may wait for that. Until it has joined,
   and for good when it cannot (logged once), every lookup answers 0: the router still
   works, it just cannot credit pool hits when placing;
2. :meth:`pooled_tokens` hashes the prompt with the cluster's block hash (seed and block
   size from a worker record) and asks the pool, in one batched existence call, for the
   longest stored prefix; errors count as 0;
3. ``close()`` leaves the pool (a join still in progress leaves as soon as it ends).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections.abc import Sequence

from kvpool.config import PoolConfig
from kvpool.hashing import hash_chain, salt_root
from kvpool.keys import KeySpace, longest_prefix
from kvpool.store import MooncakeStore, PoolUnavailableError
from proto.registry import WorkerRecord

log = logging.getLogger(__name__)


def record_keys(record: WorkerRecord) -> KeySpace:
    """The pool key space of the cluster that ``record`` belongs to."""
    return KeySpace(record.hash_seed, record.num_layers)


class PoolLookup:
    def __init__(self, config: PoolConfig, enabled: bool = True) -> None:
        self._config = dataclasses.replace(config, pool_segment_mib=0)
        self._enabled = enabled
        self._store: MooncakeStore | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._attempted = threading.Event()

    @property
    def connected(self) -> bool:
        return self._store is not None

    def start(self) -> None:
        """Begin joining the pool in the background (nothing happens when disabled)."""
        if not self._enabled:
            self._attempted.set()
            return
        thread = threading.Thread(target=self._join, name="pool-lookup-join", daemon=True)
        thread.start()

    async def wait_attempted(self, timeout_s: float) -> bool:
        """True once the join has succeeded or failed (for tests and diagnostics)."""
        deadline = time.monotonic() + timeout_s
        while not self._attempted.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return self._attempted.is_set()

    def _join(self) -> None:
        try:
            self._adopt(MooncakeStore.connect(self._config))
        except PoolUnavailableError as exc:
            log.warning("pool lookups disabled (every prompt counts as uncached): %s", exc)
        except Exception:
            log.exception("pool lookups disabled: joining the pool failed")
        finally:
            self._attempted.set()

    def _adopt(self, store: MooncakeStore) -> None:
        with self._lock:
            if not self._closed:
                self._store = store
                log.info("joined the pool at %s for prefix lookups", self._config.pool_master)
                return
        store.close()  # closed while joining

    async def pooled_tokens(
        self, token_ids: Sequence[int], record: WorkerRecord, cache_salt: str = ""
    ) -> int:
        """Leading tokens of ``token_ids`` stored in the pool (whole blocks; 0 if unknown),
        under the chain of ``cache_salt`` (see :func:`kvpool.hashing.salt_root`)."""
        store = self._store
        if store is None or record.block_tokens <= 0 or record.num_layers <= 0:
            return 0
        root = salt_root(cache_salt, record.hash_seed)
        hashes = hash_chain(token_ids, record.block_tokens, record.hash_seed, root)
        if not hashes:
            return 0
        try:
            blocks = await asyncio.to_thread(longest_prefix, store, record_keys(record), hashes)
        except Exception as exc:  # a lookup is a hint: never fail a request for it
            log.warning("pool lookup failed: %s", exc)
            return 0
        return blocks * record.block_tokens

    async def close(self) -> None:
        with self._lock:
            self._closed = True
            store, self._store = self._store, None
        if store is not None:
            await asyncio.to_thread(store.close)

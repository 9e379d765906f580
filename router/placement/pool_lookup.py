"""How many leading prompt tokens the shared pool holds, asked as a pure pool client.

Lifecycle of :class:`PoolLookup`:

1. ``start()`` joins the pool with no segment of its own (``pool_segment_mib=0``) in a
   daemon thread: the binding blocks, for a minute and more when the master is
   unreachable, and neither start-up nor shutdown may wait for that. Until it has joined,
   and for good when it cannot (logged once), every lookup answers 0: the router still
   works, it just cannot credit pool hits when placing;
2. :meth:`prompt_chain` hashes the prompt with the cluster's keyed prefix chain (the names
   that the router's prefix index uses too) and :meth:`pooled` asks the pool, in one batched
   existence call, for the longest stored prefix (:meth:`pooled_tokens`: both). The chain is
   this router's own: its cluster secret and hash algorithm (:class:`ClusterConfig`), over
   the namespace named in the worker record's KV contract (model, dtype, block size); a
   record whose namespace names another algorithm or is malformed gets no chain (0), so a
   record can neither choose the algorithm nor the key. Errors count as 0, and so does a
   lookup that finds every one of the :data:`LOOKUP_THREADS` lookup threads busy or that
   gets no answer within ``timeout_s`` (counted in :attr:`PoolLookup.timeouts`; both logged
   at most once per :data:`LOG_EVERY_S`). Lookups run in daemon threads of their own: calls
   stuck on a frozen master hold at most those few threads, never the event loop's default
   executor that the registry poll uses, nor the process's exit;
3. ``close()`` leaves the pool (a join still in progress leaves as soon as it ends).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvpool.config import PoolConfig
from kvpool.hashing import Namespace, PrefixHasher
from kvpool.keyring import Keyring
from kvpool.keys import KeySpace, longest_prefix
from kvpool.store import MooncakeStore, PoolUnavailableError
from proto.registry import ClusterConfig, WorkerRecord
from router.config import RouterConfig

log = logging.getLogger(__name__)

LOOKUP_THREADS = 4
"""Lookups in flight at once: each is one RPC of milliseconds, so a few threads keep up
with any request rate, and a frozen master can hold no more threads than this."""
LOG_EVERY_S = 60.0
"""Least time between two warnings of lookups given up or failed."""


@functools.lru_cache(maxsize=32)
def record_chain(contract: str, num_layers: int, keyring: Keyring) -> tuple[PrefixHasher, KeySpace]:
    """The prefix hasher and pool key space of a worker whose KV contract is ``contract``
    (``<namespace key>|<wire layout>``), under this router's ``keyring``; ``ValueError``
    when the contract names no namespace, or one of another algorithm than the keyring's.
    Cached: a cluster has one contract, so each lookup does not parse it again."""
    namespace = Namespace.parse(contract.rpartition("|")[0])
    if namespace.algorithm != keyring.algorithm:
        raise ValueError(
            f"a worker's namespace uses {namespace.algorithm}, this router {keyring.algorithm}"
        )
    hasher = PrefixHasher(namespace, keyring.prefix_root)
    return hasher, KeySpace.of(namespace, num_layers, keyring.pool_block)


@dataclass(frozen=True)
class PromptChain:
    """A prompt's full blocks, named: ``hashes`` (one per ``block_tokens`` tokens) and the
    pool ``keys`` they live under."""

    hashes: list[int]
    block_tokens: int
    keys: KeySpace

    def usable(self, prompt_tokens: int) -> list[int]:
        """The names a worker can take from a cache for a prompt of ``prompt_tokens``: all
        but a last block that would hold the last token (it is always computed, for the
        logits of the first output token)."""
        return self.hashes[: max(0, prompt_tokens - 1) // self.block_tokens]


class PoolLookup:
    def __init__(
        self,
        config: PoolConfig,
        cluster: ClusterConfig,
        enabled: bool = True,
        timeout_s: float = RouterConfig.pool_lookup_timeout_s,
    ) -> None:
        self._config = dataclasses.replace(config, pool_segment_mib=0, pool_ssd_dir="")
        self._keyring = cluster.keyring
        self._enabled = enabled
        self._timeout_s = timeout_s
        self._store: MooncakeStore | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._attempted = threading.Event()
        self._threads = threading.BoundedSemaphore(LOOKUP_THREADS)
        self.timeouts = 0
        """Lookups given up (no answer in time, or no free thread) since start."""
        self._quiet_until = 0.0

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

    def prompt_chain(
        self, token_ids: Sequence[int], record: WorkerRecord, cache_salt: str = ""
    ) -> PromptChain | None:
        """The block names of ``token_ids``'s full blocks under the chain of ``cache_salt``
        (see :meth:`kvpool.hashing.PrefixHasher.root`), in the key space of ``record``'s KV
        contract: the names the workers' caches and the pool use. None when ``record``
        names no usable contract (logged, at most every :data:`LOG_EVERY_S`)."""
        if record.num_layers <= 0:
            return None
        try:
            hasher, keys = record_chain(record.contract, record.num_layers, self._keyring)
        except ValueError as exc:
            self._warn(f"pool lookups skipped for worker {record.worker_id}: {exc}")
            return None
        block_tokens = hasher.namespace.block_tokens
        hashes = hasher.chain(token_ids, block_tokens, hasher.root(cache_salt))
        return PromptChain(hashes, block_tokens, keys)

    async def pooled_tokens(
        self, token_ids: Sequence[int], record: WorkerRecord, cache_salt: str = ""
    ) -> int:
        """Leading tokens of ``token_ids`` stored in the pool (whole blocks; 0 if unknown),
        under the chain of ``cache_salt``: :meth:`prompt_chain`, then :meth:`pooled`."""
        chain = self.prompt_chain(token_ids, record, cache_salt)
        return 0 if chain is None else await self.pooled(chain)

    async def pooled(self, chain: PromptChain) -> int:
        """Leading tokens of ``chain`` stored in the pool (whole blocks; 0 if unknown)."""
        store = self._store
        if store is None or not chain.hashes:
            return 0
        if not self._threads.acquire(blocking=False):
            self.timeouts += 1
            self._warn("pool lookups skipped: every lookup thread still awaits the master")
            return 0
        keys, hashes = chain.keys, chain.hashes
        try:
            blocks = await asyncio.wait_for(
                asyncio.wrap_future(self._in_thread(lambda: longest_prefix(store, keys, hashes))),
                self._timeout_s,
            )
        except TimeoutError:
            self.timeouts += 1
            self._warn(f"pool lookups time out: no answer within {self._timeout_s:g} s")
            return 0
        except Exception as exc:  # a lookup is a hint: never fail a request for it
            self._warn(f"pool lookups fail: {exc}")
            return 0
        return blocks * chain.block_tokens

    def _in_thread(self, work: Callable[[], int]) -> concurrent.futures.Future[int]:
        """Run ``work`` in a new daemon thread that releases one of :attr:`_threads` (which
        the caller holds) when it ends, however late."""
        future: concurrent.futures.Future[int] = concurrent.futures.Future()

        def run() -> None:
            try:
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(work())
                    except Exception as exc:
                        future.set_exception(exc)
            finally:
                self._threads.release()

        try:
            threading.Thread(target=run, name="pool-lookup", daemon=True).start()
        except BaseException:
            self._threads.release()
            raise
        return future

    def _warn(self, message: str) -> None:
        """Log ``message`` (and every prompt counted as uncached) at most every
        :data:`LOG_EVERY_S`: one per request would flood the log while the pool is down."""
        now = time.monotonic()
        if now >= self._quiet_until:
            self._quiet_until = now + LOG_EVERY_S
            log.warning("%s; counting such prompts as uncached (%d timed out or skipped so "
                        "far)", message, self.timeouts)  # fmt: skip

    async def close(self) -> None:
        with self._lock:
            self._closed = True
            store, self._store = self._store, None
        if store is not None:
            await asyncio.to_thread(store.close)

"""Layer-wise pool writes of one engine step, for any engine (ours, or vLLM's through its
KV connector): what a step may write, planned once; each layer put while the next one
computes; the metas committed after the last.

Lifecycle of one step's writes:

1. before the step runs, :meth:`StreamWriter.plan_writes` takes each request's
   :class:`WriteIntent` (the full blocks the step completes, named and with their pages,
   and for a prompt handed off to a decode worker its partial last block), drops the blocks
   another request of the step or a queued commit already covers, admits the rest into the
   chain index (chain-aware eviction) and keeps those the pool lacks;
2. while the model runs, :meth:`StepWrite.on_layer` is called after each layer: that
   layer's spans are put on the writer's helper thread while the next layer computes
   (layer-wise streaming; without streaming nothing moves until the step ends);
3. after the step, :meth:`StepWrite.finish` waits for the last layers (from then on the
   pages may change hands) and queues the commit of the blocks' metas on the same helper
   thread, or waits for it too (``wait_commit``: an engine whose readers look a prompt up
   once, without polling for its metas, must not answer before they are in);
4. a failed step calls :meth:`StepWrite.abandon` instead: nothing of it becomes visible.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import NamedTuple

from kvpool.block_write import BlockWrite, PendingBlock
from kvpool.pool import KVPool
from kvpool.stats import Lease

log = logging.getLogger(__name__)


@dataclass
class Transfer:
    """KV moved for one request (or one step): bytes, time spent, time not hidden."""

    bytes: int = 0
    seconds: float = 0.0
    exposed_seconds: float = 0.0

    def add(self, other: Transfer) -> None:
        self.bytes += other.bytes
        self.seconds += other.seconds
        self.exposed_seconds += other.exposed_seconds


class WriteIntent(NamedTuple):
    """What one request's step may write: its full ``blocks`` completed by the step, as
    ``(name, page)`` in chain order, the first extending ``parent`` (``None``: the chain's
    first block), and for a prompt handed off whose prefill ends in this step, the
    ``partial`` last block as ``(page, valid tokens)``."""

    request_id: str
    blocks: list[tuple[int, int]]
    parent: int | None
    partial: tuple[int, int] | None = None


class WriteCandidate(NamedTuple):
    """A full block a step may write to the pool: the ``page`` it is read from, the
    request that owns the write (``owner``: the first that names the block in the step)
    and the block it extends (``None``: its chain's first)."""

    page: int
    owner: str
    parent: int | None


class StepWrite:
    """The pool writes of one step; see the module docstring for the order of calls."""

    def __init__(
        self,
        write: BlockWrite[KVPool],
        executor: ThreadPoolExecutor | None,
        owners: dict[str, int],
        leases: list[Lease],
        in_flight: set[str] | None = None,
    ) -> None:
        self.write = write
        self.executor = executor
        self.in_flight = in_flight if in_flight is not None else set()
        """Meta keys whose commit is queued (shared with the writer; read by ``plan_writes``)."""
        self.owners = owners
        """request id -> how many of the step's blocks are its own (for attribution)."""
        self.leases = leases
        self._pending: list[Future[None]] = []

    def on_layer(self, layer: int) -> None:
        """Layer ``layer`` of the step is computed (its KV is in the pages)."""
        if self.executor is not None and self.write.blocks:
            after = self.write.pool.io.mark()  # on a GPU: the copy out waits for this layer
            self._pending.append(self.executor.submit(self.write.write_layer, layer, after))

    def finish(self, wait_commit: bool = False) -> Transfer:
        """Wait for the layer puts and queue the commit (``wait_commit``: and wait for it;
        without streaming: write and commit everything now)."""
        t0 = time.perf_counter()
        for lease in self.leases:
            self.write.pool.partials.lease(lease.request_id, lease.expires)
        if self.executor is None:
            self.write.write_all()
        else:
            for layer_write in self._pending:
                layer_write.result()
            if self.write.blocks:
                keys = {block.meta_key for block in self.write.blocks}
                self.in_flight.update(keys)
                commit = self.executor.submit(self.write.commit)
                commit.add_done_callback(lambda f: self._committed(f, keys))
                if wait_commit:
                    commit.result()
        return Transfer(self.write.bytes, self.write.seconds, time.perf_counter() - t0)

    def abandon(self) -> None:
        """The step failed: wait for the layer puts already queued (the pages must not
        change hands under them) and commit nothing, so no block whose layers are incomplete
        ever becomes visible; the layers written stay invisible without their meta."""
        for layer_write in self._pending:
            try:
                layer_write.result()
            except Exception as exc:  # the step is lost anyway; the engine goes on
                log.warning("a KV layer write of a failed step failed too: %s", exc)

    def _committed(self, future: Future[int], keys: set[str]) -> None:
        self.in_flight.difference_update(keys)
        if (exc := future.exception()) is not None:
            log.error("committing KV blocks to the pool failed: %s", exc)


class StreamWriter:
    """Plans and runs one engine's pool writes. Lifecycle: construct -> per step
    :meth:`plan_writes` -> ``on_layer``... -> ``finish`` -> :meth:`close` at shutdown."""

    def __init__(self, pool: KVPool, streaming: bool = True) -> None:
        self.pool = pool
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="kv-write") if streaming else None
        self.in_flight: set[str] = set()
        """Meta keys of blocks whose layers are in and whose commit is queued: present in a
        moment, so never rewritten (nor their layers healed away) meanwhile."""

    def plan_writes(self, intents: Iterable[WriteIntent]) -> StepWrite:
        """The writes of a step whose requests may write ``intents``."""
        candidates: dict[int, WriteCandidate] = {}  # by block hash; the first one wins
        partials: list[PendingBlock] = []
        leases: list[Lease] = []
        owners: dict[str, int] = {}
        for intent in intents:
            if intent.partial is not None:
                page, tokens = intent.partial
                block = self.pool.partials.pending(intent.request_id, page, tokens)
                partials.append(block)
                leases.append(Lease(block.expires, intent.request_id))
                owners[intent.request_id] = 1
            parent = intent.parent
            for block_hash, page in intent.blocks:
                if self.pool.keys.meta_key(block_hash) not in self.in_flight:
                    candidates.setdefault(
                        block_hash, WriteCandidate(page, intent.request_id, parent)
                    )
                parent = block_hash
        hashes = list(candidates)
        admitted = self.pool.admit(hashes, [candidates[h].parent for h in hashes])
        todo: list[PendingBlock] = []
        absent = self.pool.absent(hashes)
        for block_hash, missing, ok in zip(hashes, absent, admitted, strict=True):
            if missing and ok:
                page, owner, _ = candidates[block_hash]
                todo.append(PendingBlock(self.pool.keys.meta_key(block_hash), page, {}))
                owners[owner] = owners.get(owner, 0) + 1
        indexed = frozenset(block.meta_key for block in todo)
        write = self.pool.begin_write(todo + partials, indexed)
        return StepWrite(write, self.executor, owners, leases, self.in_flight)

    def flush(self) -> None:
        """Wait until every queued write and commit is done (tests, shutdown)."""
        if self.executor is not None:
            self.executor.submit(lambda: None).result()

    def close(self) -> None:
        if self.executor is not None:
            self.executor.shutdown(wait=True)

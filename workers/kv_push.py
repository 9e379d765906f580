"""Prefill side of a direct push: each layer of a hand-off's prompt written straight into
the decode worker's reserved pages as it is computed, the pool written in the background.

A request that came with a :class:`kvpool.push.PushTarget` gets a :class:`PushState` in its
sequence's opaque ``push`` slot (:meth:`Pusher.state_for`, read back by :func:`push_state`;
a target that fails :func:`kvpool.push.target_error`, or a KV cache the pool does not move
in place, fails the push at once). Then, per step:

1. :meth:`Pusher.plan` (engine thread, before the model runs) names the prompt blocks the
   step completes that are not pushed yet (on the prompt's last step, every block left,
   its partial last block included), takes one more reference on every page the step reads
   from (:class:`PushStepWrite` pins them), and wraps the step's pool writes;
2. :meth:`PushStepWrite.on_layer` queues that layer's push on the pool's ``kv-write``
   thread while the next layer computes; each span is digested after it was written;
3. :meth:`PushStepWrite.finish` waits for the pushes only, then hands the step's pool
   writes (layers, then metas: :meth:`kvpool.block_write.BlockWrite.write_all`) to the
   ``kv-publish`` thread: the prompt's full blocks reach the pool for prefix reuse after
   the first token is out. The pages stay pinned until that write is done
   (:meth:`Pusher.unpin`, engine thread, every step and housekeeping). A request whose
   push succeeded has no partial block in the pool (the decode worker has it); when a push
   failed, the step waits for the pool write instead, partial block included, so the
   decode worker finds the KV in the pool (the fallback).

:meth:`Pusher.outcome` gives the pushed blocks' metas (:mod:`kvpool.meta`: digests and
MAC under the pool block key, under the names the decode worker will check them against)
once the prompt is done. A push that fails (target gone or refusing, its lease over)
writes nothing more; the request goes on, and its KV goes to the pool.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import NamedTuple

from kvpool.block_write import BlockWrite, PendingBlock
from kvpool.config import PoolConfig
from kvpool.layout import KVLayout
from kvpool.pool import KVPool
from kvpool.push import (
    PushEngine,
    PushError,
    PushOutcome,
    PushTarget,
    lease_left_s,
    target_error,
)
from kvpool.span_io import DirectIO
from kvpool.stream import StepWrite, Transfer
from workers.block_manager import BlockManager
from workers.scheduler import BatchEntry
from workers.sequence import Sequence


@dataclass(eq=False)
class PushState:
    """One hand-off's push (module docstring). Block ``target.first_block + i`` of the
    prompt is named ``meta_keys[i]``; ``sums[i]`` are its layer digests as pushed."""

    target: PushTarget
    layout: KVLayout
    """The target's slab layout."""
    meta_keys: list[str]
    partial_tokens: int
    deadline: float
    """``time.monotonic()`` past which nothing is written (the target's lease, counted
    from its issue)."""
    next_block: int
    sums: list[list[bytes]] = field(default_factory=list)
    error: str = ""
    """Why the push failed (empty while it goes on or succeeded)."""
    done: bool = False
    """Every block was pushed."""
    bytes: int = 0
    seconds: float = 0.0

    def fail(self, why: str) -> None:
        if not self.error:
            self.error = why


def push_state(seq: Sequence) -> PushState | None:
    """The push ``seq`` carries (its :attr:`~workers.sequence.Sequence.push` slot, which only
    this module fills: :meth:`Pusher.state_for`), if any."""
    return seq.push if isinstance(seq.push, PushState) else None


class PushJob(NamedTuple):
    """One step's share of a push: prompt blocks ``start``..``end`` from ``src`` pages here
    to ``dst`` pages there; ``final``: the prompt's last step."""

    state: PushState
    start: int
    end: int
    src: list[int]
    dst: list[int]
    final: bool


class Pusher:
    """The pushes of one prefill engine (module docstring). Lifecycle: construct ->
    :meth:`state_for` per request -> :meth:`plan` per step and :meth:`unpin` between steps
    (engine thread) -> :meth:`close`."""

    def __init__(self, pool: KVPool, config: PoolConfig, blocks: BlockManager) -> None:
        self.pool = pool
        self.config = config
        self.blocks = blocks
        self.publisher = ThreadPoolExecutor(1, thread_name_prefix="kv-publish")
        self._engine: PushEngine | None = None
        self._engine_error = ""
        self._lock = threading.Lock()
        self._released: list[list[int]] = []
        self._used: dict[str, float] = {}
        """MACs of the targets taken, each until its lease ends (``time.monotonic()``):
        a target is good for one push (engine thread)."""

    def state_for(self, seq: Sequence, target: PushTarget) -> PushState:
        """The push of hand-off ``seq`` (its prompt named from its ``hash_root``) into
        ``target``; failed at once when the target does not fit or its lease, counted from
        its issue, is over (:func:`target_error`), or when it was taken before (one push per
        target: a relayer cannot replay it into pages that have changed hands since)."""
        pool, bt = self.pool, self.blocks.block_tokens
        prompt = seq.token_ids[: seq.num_prompt_tokens]
        full = len(prompt) // bt
        hashes = self.blocks.hasher.chain(prompt[: full * bt], bt, self.blocks.root(seq))
        keys = [pool.keys.meta_key(h) for h in hashes[target.first_block :]]
        if len(prompt) % bt:
            keys.append(pool.keys.request_key(seq.request_id))
        layout = target.layout(pool.layout)
        now = time.monotonic()
        state = PushState(target, layout, keys, len(prompt) % bt, now + lease_left_s(target), 0)
        state.next_block = target.first_block
        state.sums = [[b""] * layout.num_layers for _ in keys]
        block_key = pool.keys.block_key
        self._used = {mac: until for mac, until in self._used.items() if until > now}
        if error := target_error(target, pool.layout, len(prompt), seq.request_id, block_key):
            state.fail(f"bad push target: {error}")
        elif target.mac in self._used:
            state.fail("bad push target: it was taken before (a target is good for one push)")
        elif not isinstance(pool.io, DirectIO):
            state.fail("this worker's KV cache is not moved in place (staged)")
        else:
            self._used[target.mac] = state.deadline
        return state

    def plan(self, entries: list[BatchEntry], write: StepWrite | None) -> StepWrite | None:
        """``write`` (the step's pool writes), wrapped in a :class:`PushStepWrite` when the
        step pushes anything."""
        jobs: list[PushJob] = []
        bt = self.blocks.block_tokens
        for seq, n in entries:
            state = push_state(seq)
            final = seq.num_computed_tokens + n >= seq.num_prompt_tokens
            if state is None or state.done or (state.error and not final):
                continue  # (a failed push's last step still comes: it waits for the pool)
            if final:  # every block left, the partial last one included
                end = self.blocks.blocks_for(seq.num_prompt_tokens)
            else:  # the blocks this step completes
                end = (seq.num_computed_tokens + n) // bt
            if end <= state.next_block and not final:
                continue
            first = state.target.first_block
            src = seq.block_table[state.next_block : end]
            dst = list(state.target.pages[state.next_block - first : end - first])
            jobs.append(PushJob(state, state.next_block, end, src, dst, final))
        if not jobs:
            return write
        if write is None or write.executor is None:
            for job in jobs:
                job.state.fail("a push needs layer-wise streaming (kv_streaming)")
            return write
        pins = [block.page for block in write.write.blocks] + [p for j in jobs for p in j.src]
        self.blocks.pool.touch(pins)
        return PushStepWrite(write, jobs, self, pins)

    def _push_engine(self) -> PushEngine | None:
        """This process's push engine, started on first use (kv-write thread)."""
        if self._engine is None and not self._engine_error:
            region = [(self.pool.slab_ptr, self.pool.layout.slab_bytes)]
            try:
                self._engine = PushEngine.start(self.config, region)
            except PushError as exc:
                self._engine_error = str(exc)
        return self._engine

    def push_layer(self, jobs: list[PushJob], layer: int) -> None:
        """Write layer ``layer`` of every job's blocks to its target (kv-write thread)."""
        pool, size = self.pool, self.pool.layout.span_bytes
        for state, start, _, src, dst, _ in jobs:
            if state.error:
                continue
            if time.monotonic() > state.deadline:
                state.fail("the target's lease is over")
                continue
            engine = self._push_engine()
            if engine is None:
                state.fail(self._engine_error)
                continue
            t0 = time.perf_counter()
            srcs = [pool.slab_ptr + pool.layout.offset(layer, page) for page in src]
            base = state.target.slab_address
            dsts = [base + state.layout.offset(layer, page) for page in dst]
            if not engine.write(state.target.segment, srcs, dsts, size):
                state.fail("the target refused the write, or is gone")
                continue
            first = start - state.target.first_block
            for i, ptr in enumerate(srcs):
                state.sums[first + i][layer] = pool.digest(ptr, size)
            state.bytes += size * len(srcs)
            state.seconds += time.perf_counter() - t0

    def publish(
        self, write: BlockWrite[KVPool], in_flight: set[str], pins: list[int]
    ) -> Future[int]:
        """Write ``write``'s blocks to the pool on the kv-publish thread (their meta keys in
        ``in_flight`` meanwhile: see :attr:`workers.kv_transfer.KVStreamer.in_flight`), then
        hand ``pins`` back for :meth:`unpin`."""
        keys = {block.meta_key for block in write.blocks}
        in_flight.update(keys)

        def run() -> int:
            try:
                return write.write_all()
            finally:
                in_flight.difference_update(keys)
                self.release(pins)

        return self.publisher.submit(run)

    def release(self, pins: list[int]) -> None:
        """Pages a step no longer reads (any thread); given back by :meth:`unpin`."""
        with self._lock:
            self._released.append(pins)

    def unpin(self) -> int:
        """Give back the pages released since the last call (engine thread); how many."""
        with self._lock:
            released, self._released = self._released, []
        for pins in released:
            self.blocks.pool.free(pins)
        return sum(len(p) for p in released)

    def flush(self) -> None:
        """Wait until every background pool write is done (tests, shutdown)."""
        self.publisher.submit(lambda: None).result()

    def outcome(self, state: PushState) -> PushOutcome:
        """The result a prefill answers for ``state`` (its metas when it succeeded)."""
        if state.error or not state.done:
            return PushOutcome(False, [], state.error or "the prompt was not pushed in full")
        last, codec = len(state.meta_keys) - 1, self.pool.codec
        tail = {"tokens": float(state.partial_tokens)} if state.partial_tokens else {}
        metas = [
            codec.encode(key, sums, tail if i == last else {})
            for i, (key, sums) in enumerate(zip(state.meta_keys, state.sums, strict=True))
        ]
        return PushOutcome(True, metas)

    def close(self) -> None:
        self.publisher.shutdown(wait=True)
        self.unpin()
        if self._engine is not None:
            self._engine.close()
            self._engine = None


class PushStepWrite(StepWrite):
    """A step's writes when it pushes (module docstring): the pushes on the pool's
    kv-write thread layer by layer, its pool writes afterwards on kv-publish."""

    def __init__(
        self, inner: StepWrite, jobs: list[PushJob], pusher: Pusher, pins: list[int]
    ) -> None:
        super().__init__(inner.write, inner.executor, inner.owners, inner.leases, inner.in_flight)
        self.jobs = jobs
        self.pusher = pusher
        self.pins = pins
        self._before = sum(job.state.bytes for job in jobs), sum(j.state.seconds for j in jobs)

    def on_layer(self, layer: int) -> None:
        if self.executor is not None:
            self._pending.append(self.executor.submit(self.pusher.push_layer, self.jobs, layer))

    def finish(self, wait_commit: bool = False) -> Transfer:
        t0 = time.perf_counter()
        for layer_push in self._pending:
            layer_push.result()
        for state, _, end, _, _, final in self.jobs:
            if not state.error:
                state.next_block = end
                state.done = final
        failed = any(job.state.error for job in self.jobs)
        pool = self.write.pool
        # partial last blocks the decode worker has (request keys): not for the pool
        pushed = {s.meta_keys[-1] for s, *_ in self.jobs if s.done and s.partial_tokens}
        for lease in self.leases:
            if pool.keys.request_key(lease.request_id) not in pushed:
                pool.lease(lease.request_id, lease.expires)
        blocks = [block for block in self.write.blocks if block.meta_key not in pushed]
        indexed = self.write.indexed & {block.meta_key for block in blocks}
        write = pool.begin_write(blocks, indexed)
        if isinstance(pool.io, DirectIO):  # what was pushed is not digested again
            write = KnownSumsWrite(pool, blocks, self._known_sums(), indexed)
        published = self.pusher.publish(write, self.in_flight, self.pins)
        if failed or wait_commit:  # the pool carries a failed push's KV: it must be there now
            published.result()
            if self.executor is not None:  # earlier steps' commits, queued on kv-write
                self.executor.submit(lambda: None).result()
        nbytes = sum(job.state.bytes for job in self.jobs) - self._before[0]
        seconds = sum(job.state.seconds for job in self.jobs) - self._before[1]
        return Transfer(nbytes, seconds, time.perf_counter() - t0)

    def _known_sums(self) -> dict[str, list[bytes]]:
        """The layer digests of the blocks pushed in full so far, by meta key."""
        known: dict[str, list[bytes]] = {}
        for state in {id(job.state): job.state for job in self.jobs}.values():
            if not state.error:
                pushed = state.next_block - state.target.first_block
                known.update(zip(state.meta_keys[:pushed], state.sums[:pushed], strict=True))
        return known

    def abandon(self) -> None:
        super().abandon()
        self.pusher.release(self.pins)


class KnownSumsWrite(BlockWrite[KVPool]):
    """A :class:`~kvpool.block_write.BlockWrite` from a slab the pool moves in place whose
    blocks' layer digests may be known already (``known``, by meta key: taken as they were
    pushed, over the same pinned pages): their layers are put without being digested
    again; the others as usual."""

    def __init__(
        self,
        pool: KVPool,
        blocks: list[PendingBlock],
        known: dict[str, list[bytes]],
        indexed: frozenset[str] = frozenset(),
    ) -> None:
        super().__init__(pool, blocks, indexed)
        self.known = known

    def write_layer(self, layer: int, after: object | None = None) -> None:
        if not self.blocks:
            return
        t0 = time.perf_counter()
        pool, size = self.pool, self.pool.layout.span_bytes
        keys = [f"{block.meta_key}/{layer}" for block in self.blocks]
        ptrs = [pool.slab_ptr + pool.layout.offset(layer, block.page) for block in self.blocks]
        codes = pool.store.put_from(keys, ptrs, [size] * len(ptrs))
        for i, (block, code, ptr) in enumerate(zip(self.blocks, codes, ptrs, strict=True)):
            if code != 0:
                self.ok[i] = False
                continue
            known = self.known.get(block.meta_key)
            self.sums[i][layer] = known[layer] if known else pool.digest(ptr, size)
            self.bytes += size
        self.seconds += time.perf_counter() - t0

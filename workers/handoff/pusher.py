"""Prefill side of a direct push: each layer of a hand-off's prompt written straight into
the decode worker's reserved pages as it is computed, the pool written in the background.

A request that came with a :class:`kvpool.push.PushTarget` gets a
:class:`~workers.handoff.push_state.PushState` in its sequence's opaque ``push`` slot
(:meth:`Pusher.state_for`, read back by :func:`~workers.handoff.push_state.push_state`;
a target that fails :func:`kvpool.push.target_error`, or a KV cache the pool does not move
in place, fails the push at once). Then, per step:

1. :meth:`Pusher.plan` (engine thread, before the model runs) names the prompt blocks the
   step completes that are not pushed yet (on the prompt's last step, every block left,
   its partial last block included), takes one more reference on every page the step
   reads from (:class:`~workers.handoff.push_step.PushStepWrite` pins them), and wraps the step's
   pool writes;
2. :meth:`~workers.handoff.push_step.PushStepWrite.on_layer` queues that layer's push on the
   pool's ``kv-write`` thread while the next layer computes; each span is digested after
   it was written;
3. :meth:`~workers.handoff.push_step.PushStepWrite.finish` waits for the pushes only (on the
   prompt's last step it does not wait: the first token goes out and this step ends on
   ``kv-write``; with ``after_token`` that step's layers are all queued there), then hands
   the step's pool writes (layers, then metas:
   :meth:`kvpool.block_write.BlockWrite.write_all`) to the ``kv-publish`` thread: the
   prompt's full blocks reach the pool for prefix reuse after
   the first token is out. The pages stay pinned until that write is done
   (:meth:`Pusher.unpin`, engine thread, every step and housekeeping). A request whose
   push succeeded has no partial block in the pool (the decode worker has it); when a push
   failed, the step waits for the pool write instead, partial block included, so the
   decode worker finds the KV in the pool (the fallback).

:meth:`Pusher.outcome` gives (in ``PushState.answer``) the pushed blocks' metas
(:mod:`kvpool.meta`: digests and MAC under the pool block key, under the names the decode
worker will check them against) once the prompt is done. A push that fails (target gone
or refusing, its lease over) writes nothing more; the request goes on, and its KV goes to
the pool.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

from kvpool.block_write import BlockWrite
from kvpool.config import PoolConfig
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
from kvpool.stream import StepWrite
from workers.core.block_manager import BlockManager
from workers.core.scheduler import BatchEntry
from workers.core.sequence import Sequence
from workers.handoff.push_state import PushJob, PushState, push_state
from workers.handoff.push_step import PushStepWrite


class Pusher:
    """The pushes of one prefill engine (module docstring). Lifecycle: construct ->
    :meth:`state_for` per request -> :meth:`plan` per step and :meth:`unpin` between steps
    (engine thread) -> :meth:`close`."""

    def __init__(
        self, pool: KVPool, config: PoolConfig, blocks: BlockManager, after_token: bool = False
    ) -> None:
        self.pool = pool
        self.after_token = after_token
        """A prompt's last step pushes once its first token is answered, not layer by layer
        (``EngineConfig.kv_push_timing``)."""
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
        held = self.after_token and all(job.final for job in jobs)
        return PushStepWrite(write, jobs, self, pins, held)

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
        ``in_flight`` meanwhile: see :attr:`workers.handoff.pool_transfer.KVStreamer.in_flight`),
        then hand ``pins`` back for :meth:`unpin`."""
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

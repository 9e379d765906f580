"""A step's writes when it pushes (:mod:`workers.handoff.pusher`, steps 2 and 3):
:class:`PushStepWrite` queues each layer's push on the pool's ``kv-write`` thread as the
layer is computed (or, for a prompt's last step with ``after_token``, every layer at its
finish), then hands the step's pool writes to ``kv-publish`` (:class:`KnownSumsWrite`:
what was pushed is not digested again). A prompt's last step does not wait for its pushes:
its first token is answered at once and the step ends on ``kv-write`` (``_settle``), which
sets each push's answer. Made by :meth:`workers.handoff.pusher.Pusher.plan` for one step;
:meth:`PushStepWrite.finish` or :meth:`PushStepWrite.abandon` ends it."""

from __future__ import annotations

import contextlib
import logging
import time
from concurrent.futures import Future, InvalidStateError
from dataclasses import replace
from typing import Protocol

from kvpool.block_write import BlockWrite, PendingBlock
from kvpool.pool import KVPool
from kvpool.push import PushOutcome
from kvpool.span_io import DirectIO
from kvpool.stream import StepWrite, Transfer
from workers.handoff.push_state import PushJob, PushState

log = logging.getLogger(__name__)


class StepPusher(Protocol):
    """What a step's write uses of its engine's pusher (:class:`workers.handoff.pusher.Pusher`)."""

    def push_layer(self, jobs: list[PushJob], layer: int) -> None: ...

    def publish(
        self, write: BlockWrite[KVPool], in_flight: set[str], pins: list[int]
    ) -> Future[int]: ...

    def release(self, pins: list[int]) -> None: ...

    def outcome(self, state: PushState) -> PushOutcome: ...


class PushStepWrite(StepWrite):
    """A step's writes when it pushes (module docstring): the pushes on the pool's
    kv-write thread layer by layer, its pool writes afterwards on kv-publish."""

    def __init__(
        self,
        inner: StepWrite,
        jobs: list[PushJob],
        pusher: StepPusher,
        pins: list[int],
        after_token: bool = False,
    ) -> None:
        super().__init__(inner.write, inner.executor, inner.owners, inner.leases, inner.in_flight)
        self.jobs = jobs
        self.pusher = pusher
        self.pins = pins
        self._states = {id(j.state): (j.state, (j.state.bytes, j.state.seconds)) for j in jobs}
        """Each push of the step, and its bytes and seconds before it."""
        self.after_token = after_token
        """Push every layer at :meth:`finish`, not as each is computed (a prompt's last step
        whose transfer would slow its compute: ``EngineConfig.kv_push_timing``)."""
        self._keys = {block.meta_key for block in inner.write.blocks}
        self._published = False

    def on_layer(self, layer: int) -> None:
        if self.executor is not None and not self.after_token:
            self._pending.append(self.executor.submit(self.pusher.push_layer, self.jobs, layer))

    def finish(self, wait_commit: bool = False) -> Transfer:
        """A prompt's last step (every job final, no wait asked) ends at once: its first
        token is answered while the last layers' pushes run, and :meth:`_settle` ends it on
        the kv-write thread (each state's ``answer``). Any other step waits for its pushes."""
        t0 = time.perf_counter()
        if self.executor is not None and self.after_token:  # every layer is computed now
            push, layers = self.pusher.push_layer, self.write.pool.layout.num_layers
            self._pending = [self.executor.submit(push, self.jobs, n) for n in range(layers)]
        if self.executor is not None and not wait_commit and all(j.final for j in self.jobs):
            for job in self.jobs:
                job.state.settling = True
            self.in_flight.update(self._keys)  # not planned again before their commit
            self.executor.submit(self._settle)  # after this step's layer pushes: one thread
            return Transfer(0, 0.0, time.perf_counter() - t0)
        for layer_push in self._pending:
            layer_push.result()
        self._publish(wait_commit)
        moved = self._moved()
        nbytes, seconds = sum(b for _, b, _ in moved), sum(t for _, _, t in moved)
        return Transfer(nbytes, seconds, time.perf_counter() - t0)

    def _moved(self) -> list[tuple[PushState, int, float]]:
        """Each push of the step, with the bytes and seconds it moved in this step."""
        return [(s, s.bytes - b, s.seconds - t) for s, (b, t) in self._states.values()]

    def _publish(self, wait_commit: bool, on_writer: bool = False) -> None:
        """Mark what was pushed, then hand the step's pool writes to kv-publish; a failed
        push's (and ``wait_commit``) waits until the pool has them (``on_writer``: this runs
        on the kv-write thread, so nothing queued there is left to wait for)."""
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
                pool.partials.lease(lease.request_id, lease.expires)
        blocks = [block for block in self.write.blocks if block.meta_key not in pushed]
        indexed = self.write.indexed & {block.meta_key for block in blocks}
        write = pool.begin_write(blocks, indexed)
        if isinstance(pool.io, DirectIO):  # what was pushed is not digested again
            write = KnownSumsWrite(pool, blocks, self._known_sums(), indexed)
        self.in_flight.difference_update(self._keys - {block.meta_key for block in blocks})
        published = self.pusher.publish(write, self.in_flight, self.pins)
        self._published = True
        if failed or wait_commit:  # the pool carries a failed push's KV: it must be there now
            published.result()
            if self.executor is not None and not on_writer:  # earlier steps' commits
                self.executor.submit(lambda: None).result()

    def _settle(self) -> None:
        """The end of a prompt's last step, on the kv-write thread after its layer pushes:
        :meth:`_publish`, then each push's answer, with the KV it moved. A failure here
        fails the push (the decode worker then reads the pool, or recomputes)."""
        error = ""
        try:
            for layer_push in self._pending:
                layer_push.result()
            self._publish(False, on_writer=True)
        except Exception as exc:
            log.exception("finishing a prompt's last push step failed")
            error = f"finishing the push failed: {exc}"
            if not self._published:  # its pages and keys are not the publisher's to free
                self.in_flight.difference_update(self._keys)
                self.pusher.release(self.pins)
        for state, nbytes, seconds in self._moved():
            if error:
                state.fail(error)
            moved = replace(self.pusher.outcome(state), bytes=nbytes, seconds=seconds)
            with contextlib.suppress(InvalidStateError):  # given up: its call ended
                state.answer.set_result(moved)

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

"""Decode side of a hand-off: the live reservations of one engine (:class:`Reservations`),
each a :class:`~workers.handoff.reservation.Reservation` moving through the states of
:mod:`workers.handoff.reservation` (RESERVED, LANDING, LANDED, ADOPTED, EXPIRED, CANCELLED): pages
held for a prompt whose prefill runs on another worker, the prompt's KV landing in them (or
pushed into them), and the take-over by the request with its first token. Every call runs
on the engine thread.

EXPIRED and CANCELLED give the pages back (``Scheduler.finish`` with ``ABORT``), only
after the landing was cancelled (:meth:`kvpool.landing.Lander.cancel`), so nothing writes
into reused pages. A reservation leaves the set when it leaves RESERVED/LANDING. The pages
of one that offered a push and ended unadopted are given back only
:data:`PUSH_QUARANTINE_S` later (:meth:`Reservations.expire`): this worker cannot stop a
remote write, and the prefill worker's push of its current step may still be on its way.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from kvpool.landing import Lander, Landing
from kvpool.pool import KVPool
from kvpool.push import PushTarget
from kvpool.stream import Transfer
from workers.core.scheduler import Scheduler
from workers.core.sequence import FinishReason, SamplingParams, Sequence
from workers.handoff.arrival import Arrival
from workers.handoff.pool_transfer import pull_prompt, start_landing
from workers.handoff.push_receive import (
    PushCheck,
    PushVerdict,
    PushWatch,
    push_check,
    push_target,
    pushed_blocks,
    take_pushed,
)
from workers.handoff.reservation import HandoffState, Reservation

log = logging.getLogger(__name__)
PUSH_QUARANTINE_S = 10.0
"""How long the pages of a reservation that offered a direct push stay out of use after it
ended unadopted (aborted, expired, superseded). The prefill worker is aborted with it (the
router aborts every worker of a request, and a prefill whose call ends is aborted) and
writes nothing past the step it is in, nor past the lease it was given; a step with its
pushes takes well under this."""


class Reservations:
    """The live (RESERVED or LANDING) reservations of one engine, by request id.

    Lifecycle: construct (with the pool and streaming: a :class:`Lander` thread) ->
    ``reserve`` / ``adopt`` / ``release`` / ``expire`` -> :meth:`close` (releases all)."""

    def __init__(self, scheduler: Scheduler, pool: KVPool | None, streaming: bool) -> None:
        self.scheduler = scheduler
        self.pool = pool
        self.lander = Lander() if pool is not None and streaming else None
        self._held: dict[str, Reservation] = {}
        self._quarantined: list[tuple[float, Sequence]] = []
        """Ended push reservations whose pages come back at the given time."""

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._held

    def landing(self, request_id: str) -> Landing | None:
        """The pull of a reservation's prompt KV still in progress, if any (the caller may
        wait for it off the engine thread, :meth:`kvpool.landing.Landing.settle`, before
        :meth:`adopt`)."""
        held = self._held.get(request_id)
        return held.landing if held is not None else None

    def nudge(self) -> None:
        """A prefill just answered: have the landings poll now (thread-safe)."""
        if self.lander is not None:
            self.lander.nudge()

    def prefill_answered(self, request_id: str) -> Landing | None:
        """The remote prefill of ``request_id`` answered: its :meth:`landing`, if one runs,
        polled at once (:meth:`nudge`)."""
        landing = self.landing(request_id)
        if landing is not None:
            self.nudge()
        return landing

    def arrived(self, request_id: str, pushed: bool) -> Arrival:
        """The remote prefill of ``request_id`` answered, ``pushed``: with the metas of a
        push that went through. What to wait for, off this thread, before :meth:`adopt`
        (:mod:`workers.handoff.arrival`): its landing (:meth:`prefill_answered`), or the
        check of its pushed pages (:meth:`push_check`)."""
        check = self.push_check(request_id) if pushed else None
        return Arrival(self.prefill_answered(request_id), check)

    def reserve(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        max_tokens: int,
        lease_s: float,
        hash_root: int | None = None,
        offer_push: bool = False,
    ) -> Sequence | None:
        """Hold pages for a prompt (its hash chain rooted at ``hash_root``, the root of the
        request's cache salt; ``None``: unsalted) for ``lease_s``: the reserved sequence, or
        ``None`` if the pages are not free now (or owed to the queued requests:
        :meth:`owed_pages`); ``ValueError`` if the request can never fit. ``offer_push``:
        offer the pages for a direct push (:meth:`push_target`) where this worker can take
        one, instead of landing the prompt from the pool."""
        assert request_id not in self._held, f"{request_id} is already reserved"
        seq = Sequence(request_id, list(prompt_token_ids), SamplingParams(max_tokens=max_tokens))
        seq.hash_root = hash_root
        self.scheduler.check_fits(seq)
        if self._owed_to_queue(seq) or not self.scheduler.reserve(seq):
            return None
        held = self._held[request_id] = Reservation(seq, time.monotonic() + lease_s)
        if offer_push and self.pool is not None:
            held.push = push_target(self.pool, self.scheduler.blocks, seq, lease_s)
            self._watch(held)
        if self.lander is not None and self.pool is not None and held.push is None:
            try:
                landing = start_landing(
                    self.pool, self.lander, self.scheduler.blocks, seq, held.deadline
                )
            except Exception:  # the reservation stands; adopt reads the pool then instead
                log.exception("could not start landing the KV of %s", request_id)
            else:
                held.landing = landing
                held.move(HandoffState.LANDING)
        return seq

    def push_target(self, request_id: str) -> PushTarget | None:
        """Where the prompt of reserved ``request_id`` may be pushed, if it offered that."""
        held = self._held.get(request_id)
        return held.push if held is not None else None

    def _watch(self, held: Reservation) -> None:
        """Start checking ``held``'s pushed blocks as they complete (:class:`PushWatch`)."""
        assert self.pool is not None
        fills = pushed_blocks(self.pool, self.scheduler.blocks, held.seq)
        if held.push is not None and fills is not None and self.lander is not None:
            held.watch = PushWatch(self.pool, fills, held.deadline)
            self.lander.add(held.watch)

    def push_check(self, request_id: str) -> PushCheck | None:
        """The check of the pages pushed into reserved ``request_id`` past what its watch
        verified (the watch ends here; ``None``: it offered no push, or holds nothing), to
        run off the engine thread before :meth:`adopt`."""
        held = self._held.get(request_id)
        if held is None or held.push is None or self.pool is None:
            return None
        skip = 0
        if held.watch is not None and self.lander is not None:
            self.lander.cancel(held.watch, keep=False)
            skip = held.watch.count
        return push_check(self.pool, self.scheduler.blocks, held.seq, skip)

    def owed_pages(self) -> int:
        """Pages the requests waiting in the scheduler's queue need to run (all of their
        tokens, prefix hits not deducted: an upper bound)."""
        blocks = self.scheduler.blocks
        return sum(blocks.blocks_for(seq.num_tokens) for seq in self.scheduler.waiting)

    def _owed_to_queue(self, seq: Sequence) -> bool:
        """Whether reserving ``seq`` (all of its prompt's pages, at most) would take pages
        the queued requests wait for."""
        if not self.scheduler.waiting:
            return False
        need = self.scheduler.blocks.blocks_for(seq.num_prompt_tokens)
        return self.scheduler.blocks.num_free < need + self.owed_pages()

    def take(self, request_id: str, prompt_token_ids: list[int]) -> Reservation | None:
        """The reservation of ``request_id``, LANDED (its landing stopped, keeping what it
        verified), leaving this set; ``None`` if there is none, or if it was for another
        prompt (then CANCELLED: its pages are back)."""
        held = self._held.pop(request_id, None)
        if held is None:
            return None
        if held.seq.token_ids != list(prompt_token_ids):
            self._end(held, HandoffState.CANCELLED)
            return None
        self._stop_landing(held, keep=True)
        held.move(HandoffState.LANDED)
        return held

    def adopt(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        first_token: int,
        params: SamplingParams,
        on_adopted: Callable[[Sequence, Transfer], None] | None = None,
        pushed: PushVerdict | None = None,
    ) -> tuple[Sequence, Transfer] | None:
        """Run reserved ``request_id`` after its remote prefill produced ``first_token``
        (:meth:`take`, then ADOPTED: see the module docstring): the running sequence and the
        KV read for it; ``None`` without a reservation for this prompt.

        ``on_adopted(seq, transfer)``: the caller's own bookkeeping of the take-over (the
        engine tracks the request), run last, before the record is ADOPTED. A take-over that
        raises, ``on_adopted`` included, is CANCELLED (its pages back) and re-raised, so a
        record is ADOPTED only once the take-over succeeded in full; undoing what
        ``on_adopted`` did before it raised is the caller's.

        ``pushed``: the check of a direct push into this reservation's pages against the
        pushed metas (:meth:`push_check`, run off this thread); without it a reservation
        that offered a push reads the pool now (the push failed)."""
        held = self.take(request_id, prompt_token_ids)
        if held is None:
            return None
        seq = held.seq
        try:
            seq.params = params
            transfer = Transfer()
            if self.pool is not None:
                try:
                    transfer = self._take_prompt(held, pushed)
                except Exception:  # the pool is a cache: what did not arrive is computed
                    log.exception("reading the prompt KV of %s failed", request_id)
            self.scheduler.blocks.commit(seq, share=True)  # one copy of a shared prefix
            seq.token_ids.append(first_token)
            self.scheduler.resume(seq)
            if on_adopted is not None:
                on_adopted(seq, transfer)
        except BaseException:  # nothing half-adopted stays: its pages go back
            self._end(held, HandoffState.CANCELLED)
            raise
        held.move(HandoffState.ADOPTED)
        return seq, transfer

    def _take_prompt(self, held: Reservation, pushed: PushVerdict | None) -> Transfer:
        """The prompt's KV into ``held``'s pages: what was pushed and verifies, or else
        from the pool (what its landing verified, or read now)."""
        assert self.pool is not None
        blocks = self.scheduler.blocks
        if held.push is not None and pushed is not None:
            return take_pushed(held.seq, pushed)
        return pull_prompt(self.pool, blocks, held.seq, held.landing)

    def release(self, request_id: str) -> bool:
        """CANCEL a reservation (abort, or its id superseded); False if there is none."""
        held = self._held.pop(request_id, None)
        if held is not None:
            self._end(held, HandoffState.CANCELLED)
        return held is not None

    def expire(self, now: float | None = None) -> int:
        """EXPIRE every reservation whose lease ran out by ``now``; returns how many. Gives
        back the pages of ended push reservations whose quarantine is over."""
        now = time.monotonic() if now is None else now
        due = [held for held in self._held.values() if held.deadline <= now]
        for held in due:
            del self._held[held.request_id]
            self._end(held, HandoffState.EXPIRED, now)
        over = [seq for until, seq in self._quarantined if until <= now]
        self._quarantined = [(until, seq) for until, seq in self._quarantined if until > now]
        for seq in over:
            self.scheduler.finish(seq, FinishReason.ABORT)
        return len(due)

    def _end(self, held: Reservation, state: HandoffState, now: float | None = None) -> None:
        """Move ``held`` to ``state`` (EXPIRED or CANCELLED) and give its pages back, its
        landing cancelled first; those of a push reservation after its quarantine."""
        held.move(state)
        self._stop_landing(held, keep=False)
        if held.push is not None:
            now = time.monotonic() if now is None else now
            self._quarantined.append((now + PUSH_QUARANTINE_S, held.seq))
            return
        self.scheduler.finish(held.seq, FinishReason.ABORT)

    def _stop_landing(self, held: Reservation, keep: bool) -> None:
        """Cancel ``held``'s landing (``keep``: verify what it read in full, for a
        take-over; see :meth:`kvpool.landing.Lander.cancel`)."""
        if held.landing is not None and self.lander is not None:
            self.lander.cancel(held.landing, keep)
        if held.watch is not None and self.lander is not None:
            self.lander.cancel(held.watch, keep=False)

    def close(self) -> None:
        """Release every reservation and stop the lander thread."""
        for request_id in list(self._held):
            self.release(request_id)
        for _, seq in self._quarantined:
            self.scheduler.finish(seq, FinishReason.ABORT)
        self._quarantined = []
        if self.lander is not None:
            self.lander.close()
            self.lander = None

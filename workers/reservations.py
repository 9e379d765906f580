"""Decode side: pages held for prompts whose prefill runs on another worker.

Lifecycle of one reservation (all calls on the engine thread):

1. :meth:`Reservations.reserve` takes the prompt's local prefix hits and fresh pages for the
   rest, under a lease, and (with streaming) starts a :class:`~kvpool.landing.Landing` that
   reads the prompt's KV into those pages as the prefill worker writes it (a landing that
   cannot start is logged: the take-over then reads the pool itself). It never takes
   pages owed to the requests queued in this worker's scheduler (preempted ones, which held
   pages, and those that came first): while they wait for pages, the reservation is "not
   now", and the router's request waits its turn (:mod:`router.kv_wait`);
2. then exactly one of: :meth:`Reservations.take` (the request arrives with its first
   token; the landing is stopped, keeping the leading blocks it read in full and verified,
   and handed over with the sequence), :meth:`release`
   (abort), or :meth:`expire` (the lease ran out: the prefill never came). Released pages go
   back only after their landing was cancelled, so nothing writes into reused pages.
"""

from __future__ import annotations

import logging
import time

from kvpool.landing import Lander, Landing
from kvpool.pool import KVPool
from workers.kv_transfer import start_landing
from workers.scheduler import Scheduler
from workers.sequence import FinishReason, SamplingParams, Sequence

log = logging.getLogger(__name__)


class Reservations:
    def __init__(self, scheduler: Scheduler, pool: KVPool | None, streaming: bool) -> None:
        self.scheduler = scheduler
        self.pool = pool
        self.lander = Lander() if pool is not None and streaming else None
        self._held: dict[str, tuple[Sequence, float]] = {}
        """request id -> (sequence holding pages, monotonic expiry of its lease)"""
        self._landings: dict[str, Landing] = {}

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._held

    def landing(self, request_id: str) -> Landing | None:
        """The pull of a reservation's prompt KV still in progress, if any (the caller may
        wait for ``landing.done`` off the engine thread before :meth:`take`)."""
        return self._landings.get(request_id)

    def nudge(self) -> None:
        """A prefill just answered: have the landings poll now."""
        if self.lander is not None:
            self.lander.nudge()

    def reserve(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        max_tokens: int,
        lease_s: float,
        hash_root: int | None = None,
    ) -> Sequence | None:
        """Hold pages for a prompt (its hash chain rooted at ``hash_root``, the root of the
        request's cache salt; ``None``: unsalted); ``None`` if they are not free now (or
        owed to the queued requests: :meth:`owed_pages`), ``ValueError`` if the request can
        never fit."""
        assert request_id not in self._held, f"{request_id} is already reserved"
        seq = Sequence(request_id, list(prompt_token_ids), SamplingParams(max_tokens=max_tokens))
        seq.hash_root = hash_root
        self.scheduler.check_fits(seq)
        if self._owed_to_queue(seq) or not self.scheduler.reserve(seq):
            return None
        deadline = time.monotonic() + lease_s
        self._held[request_id] = (seq, deadline)
        if self.lander is not None and self.pool is not None:
            try:
                landing = start_landing(
                    self.pool, self.lander, self.scheduler.blocks, seq, deadline
                )
            except Exception:  # the reservation stands; adopt reads the pool then instead
                log.exception("could not start landing the KV of %s", request_id)
            else:
                self._landings[request_id] = landing
        return seq

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
        return self.scheduler.blocks.pool.num_free < need + self.owed_pages()

    def take(
        self, request_id: str, prompt_token_ids: list[int]
    ) -> tuple[Sequence | None, Landing | None]:
        """The reservation of ``request_id`` and its (stopped) landing, leaving this set;
        ``(None, None)`` if there is none, or if it was for another prompt (then released)."""
        entry = self._held.pop(request_id, None)
        same = entry is not None and entry[0].token_ids == list(prompt_token_ids)
        landing = self._stop_landing(request_id, keep=same)
        if entry is None:
            return None, None
        if not same:
            self.scheduler.finish(entry[0], FinishReason.ABORT)
            return None, None
        return entry[0], landing

    def release(self, request_id: str) -> bool:
        """Give a reservation's pages back; False if there is none."""
        entry = self._held.pop(request_id, None)
        if entry is None:
            return False
        self._stop_landing(request_id, keep=False)
        self.scheduler.finish(entry[0], FinishReason.ABORT)
        return True

    def expire(self, now: float | None = None) -> int:
        """Release every reservation whose lease ran out; returns how many."""
        now = time.monotonic() if now is None else now
        expired = [rid for rid, (_, until) in self._held.items() if until <= now]
        for request_id in expired:
            self.release(request_id)
        return len(expired)

    def _stop_landing(self, request_id: str, keep: bool) -> Landing | None:
        """Cancel a reservation's landing (``keep``: verify what it read in full, for a
        take-over; see :meth:`kvpool.landing.Lander.cancel`)."""
        landing = self._landings.pop(request_id, None)
        if landing is not None and self.lander is not None:
            self.lander.cancel(landing, keep)
        return landing

    def close(self) -> None:
        for request_id in list(self._held):
            self.release(request_id)
        if self.lander is not None:
            self.lander.close()
            self.lander = None

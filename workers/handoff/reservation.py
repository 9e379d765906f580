"""One decode-side reservation and its state machine: :class:`Reservation` (the pages held
for a prompt whose prefill runs on another worker, the landing or push into them) and
:class:`HandoffState`, which only moves along :data:`TRANSITIONS` (any other move raises
:class:`IllegalTransitionError`; ``Reservations`` is
:class:`workers.handoff.reservations.Reservations`):

============  =====================================================================
state         entered by
============  =====================================================================
RESERVED      :meth:`Reservations.reserve`: the prompt's local prefix hits and fresh
              pages for the rest, under a lease (``deadline``). It never takes pages
              owed to the requests queued in this worker's scheduler (preempted ones,
              which held pages, and those that came first): while they wait, the
              reservation is "not now" and the router's request waits its turn
              (:mod:`router.placement.kv_wait`).
LANDING       right after RESERVED when a :class:`~kvpool.landing.Landing` started
              (pool joined, streaming on: :func:`workers.handoff.pool_transfer.start_landing`);
              it reads the prompt's KV into the pages as the prefill worker writes it
              (one that cannot start is logged: the take-over then reads the pool).
              A reservation that offered a direct push (``offer_push`` and a
              :func:`workers.handoff.push_receive.push_target`) starts no landing: it stays
              RESERVED while the prefill worker writes into its pages.
LANDED        :meth:`Reservations.adopt`, the request came with the same prompt: the
              landing (if any) is stopped keeping the leading blocks it read in full
              and verified; nothing writes into the pages any more.
ADOPTED       the prompt's KV is taken into the pages
              (:func:`workers.handoff.pool_transfer.pull_prompt`, what is missing is left to
              compute), shared prefix pages deduplicated, the first token appended,
              the sequence runs in the scheduler and the engine tracks it (``adopt``'s
              ``on_adopted``); entered only once all of that succeeded. Terminal: the
              engine owns it.
EXPIRED       :meth:`Reservations.expire`: the lease ran out (the prefill never came).
CANCELLED     :meth:`Reservations.release` (abort, or the id superseded by a new
              request), an ``adopt`` with another prompt, or a take-over that raised.
============  =====================================================================

What each move does to the pages, and who makes it: :mod:`workers.handoff.reservations`
(:class:`~workers.handoff.reservations.Reservations`, the live set of one engine).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from kvpool.landing import Landing
from kvpool.push import PushTarget
from workers.core.sequence import Sequence
from workers.handoff.push_receive import PushWatch


class HandoffState(enum.Enum):
    RESERVED = "reserved"
    LANDING = "landing"
    LANDED = "landed"
    ADOPTED = "adopted"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


_S = HandoffState
TRANSITIONS: dict[HandoffState, frozenset[HandoffState]] = {
    _S.RESERVED: frozenset({_S.LANDING, _S.LANDED, _S.EXPIRED, _S.CANCELLED}),
    _S.LANDING: frozenset({_S.LANDED, _S.EXPIRED, _S.CANCELLED}),
    _S.LANDED: frozenset({_S.ADOPTED, _S.CANCELLED}),
    _S.ADOPTED: frozenset(),
    _S.EXPIRED: frozenset(),
    _S.CANCELLED: frozenset(),
}
"""The legal moves of a :class:`Reservation` (see the module docstring)."""


class IllegalTransitionError(RuntimeError):
    """A reservation was asked to move where its state machine has no edge (a bug)."""


@dataclass(eq=False)
class Reservation:
    """Pages held for one request's prompt: ``seq`` (``SeqStatus.RESERVED`` until adopted),
    its lease end ``deadline`` (``time.monotonic()``), its ``landing`` if one runs."""

    seq: Sequence
    deadline: float
    landing: Landing | None = None
    state: HandoffState = HandoffState.RESERVED
    push: PushTarget | None = None
    """Where a prefill worker may write the prompt's KV directly, if this offered it."""
    watch: PushWatch | None = None
    """The check of pushed blocks while the prefill runs (:class:`PushWatch`)."""

    @property
    def request_id(self) -> str:
        return self.seq.request_id

    def move(self, to: HandoffState) -> None:
        """Enter ``to``; :class:`IllegalTransitionError` if :data:`TRANSITIONS` has no such edge."""
        if to not in TRANSITIONS[self.state]:
            raise IllegalTransitionError(f"{self.request_id}: {self.state.value} -> {to.value}")
        self.state = to

"""What a decode worker waits for between a remote prefill's answer and the take-over:
:class:`Arrival`.

The decode half of a hand-off takes three calls once the router brings the first token
(``Generate`` with ``first_token``), of which only the first and the last run on the engine
thread:

1. :meth:`workers.handoff.decode_side.DecodeHandoff.arrived` (engine thread): the
   reservation's landing, if the prompt lands from the pool, is polled at once; for a
   push, the watch that verified blocks while the prefill ran ends and the check of the
   rest is made. Both go into one :class:`Arrival`;
2. :meth:`Arrival.wait` (any thread; the engine goes on decoding meanwhile): the landing
   is let finish while it makes progress (:data:`LANDING_WAIT_S`, stalls of
   :data:`kvpool.landing.STALL_S`), or the pushed pages are digested against the metas
   the prefill answered. What it finds is a :class:`PushVerdict` (None for a landing,
   which the reservation reads itself);
3. :meth:`~workers.handoff.decode_side.DecodeHandoff.adopt` (engine thread) takes the
   request over with that verdict.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

from kvpool.landing import STALL_S, Landing
from workers.handoff.push_receive import PushCheck, PushVerdict

LANDING_WAIT_S = 10.0
"""Hard cap on the wait for a landing after its prefill answered (step 2). The wait ends
sooner when the landing is over or stalls (no new object or meta for
:data:`kvpool.landing.STALL_S`: what is missing will not come); this bounds one that keeps
trickling. Either way it is cancelled then, keeping the leading blocks it verified, and the
engine recomputes the rest."""


@dataclass(frozen=True)
class Arrival:
    """One reservation's arrival (module docstring): its ``landing`` from the pool, or the
    ``check`` of the pages pushed into it; neither when it is gone, holds nothing, or
    its push was refused (the prefill then wrote the pool, which the adoption reads)."""

    landing: Landing | None = None
    check: PushCheck | None = None

    @property
    def waits(self) -> bool:
        """Whether :meth:`wait` has anything to do (so a caller can skip a thread hop)."""
        return self.landing is not None or self.check is not None

    def wait(self, pushed_metas: Seq[bytes]) -> PushVerdict | None:
        """Let the landing finish (step 2), or check the pushed pages against
        ``pushed_metas``; any thread. The verdict for :meth:`adopt`, if there was a push."""
        if self.landing is not None:
            self.landing.settle(STALL_S, LANDING_WAIT_S)
        return self.check.run(pushed_metas) if self.check is not None else None

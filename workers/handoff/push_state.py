"""A direct push's records (:mod:`workers.handoff.pusher` runs the pushes): :class:`PushState`,
one hand-off's push, carried in its sequence's opaque ``push`` slot and read back by
:func:`push_state`, and :class:`PushJob`, one step's share of it. Plain data, changed on
the engine thread (``next_block``, ``done``) and on the pool's ``kv-write`` thread while a
step's pushes run (``sums``, ``bytes``, ``seconds``, ``error``); a prompt's last step, which
ends after its first token was answered, changes them all there (``answer`` last)."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import NamedTuple

from kvpool.layout import KVLayout
from kvpool.push import PushOutcome, PushTarget
from workers.core.sequence import Sequence


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
    answer: Future[PushOutcome] = field(default_factory=Future)
    """How the push went, once known: what the prefill answers after its first token."""
    settling: bool = False
    """The prompt's last step finishes after its first token (engine thread sets it) and
    that finish sets :attr:`answer` (:class:`~workers.handoff.push_step.PushStepWrite`)."""

    def fail(self, why: str) -> None:
        if not self.error:
            self.error = why


def push_state(seq: Sequence) -> PushState | None:
    """The push ``seq`` carries (its :attr:`~workers.core.sequence.Sequence.push` slot, which only
    only :meth:`workers.handoff.pusher.Pusher.state_for` fills), if any."""
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

"""A clock the test moves by hand: call it for the time, set ``now`` to move it."""

from __future__ import annotations


class Clock:
    """A ``() -> float`` monotonic clock at ``now`` (starts at 1000 s)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

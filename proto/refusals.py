"""Refusals worth a log line, without letting whoever causes them flood the log.

:class:`Rejection` is one refused thing (a registry value, a gRPC call); :class:`RejectLog`
logs them rate-limited. Used by :mod:`proto.record_store` and :mod:`proto.grpc_auth`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass


def show(value: object) -> str:
    """``repr(value)``, cut to 60 characters (values may come from an attacker)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass(frozen=True)
class Rejection:
    """Something refused: what it was (a Redis key, decoded and cut to 200 characters; a
    gRPC method), the reason (e.g. :attr:`proto.records.RecordError.reason`) and why."""

    key: str
    reason: str
    detail: str


class RejectLog:
    """Logs refused values, each (key, reason) at most once per ``interval_s``, and at
    most ``max_keys`` distinct ones per interval (then one line counts the rest), so that whoever
    sends junk (a writer of Redis, a caller of a worker) cannot flood the log with it."""

    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        interval_s: float = 60.0,
        max_keys: int = 32,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = logger
        self._what = what
        self._interval_s = interval_s
        self._max_keys = max_keys
        self._clock = clock
        self._logged: dict[tuple[str, str], float] = {}
        self._summary_at = -float("inf")

    def note(self, rejected: Iterable[Rejection]) -> None:
        """Log those of ``rejected`` not logged within the interval (see the class)."""
        now = self._clock()
        horizon = now - self._interval_s
        self._logged = {k: t for k, t in self._logged.items() if t > horizon}
        unlogged = 0
        for r in rejected:
            if (r.key, r.reason) in self._logged:
                continue
            if len(self._logged) >= self._max_keys:
                unlogged += 1
                continue
            self._logged[(r.key, r.reason)] = now
            self._log.warning("%s %s refused (%s): %s", self._what, show(r.key), r.reason, r.detail)
        if unlogged and self._summary_at <= horizon:
            self._summary_at = now
            self._log.warning("%d more %s refusals (not logged one by one)", unlogged, self._what)

"""The P:D ratio policy: when to move a worker between the prefill and decode pools. Pure.

No I/O, no clock of its own (every call takes ``now_s``), no asyncio: the router's
:mod:`router.control.controller` drives it on a timer, and a discrete-event simulator can drive it
on simulated time.

Lifecycle of :class:`RatioController`:

1. :meth:`~RatioController.record` every finished request (its TTFT and TPOT, or None);
   they go into a :class:`SloWindow` of the last ``window_s`` seconds by finish time;
2. :meth:`~RatioController.decide` every evaluation interval with the live workers; it
   answers at most one :class:`RoleChange`, which is then *in flight*;
3. the caller drains and switches that worker, then calls exactly one of
   :meth:`~RatioController.completed` (the cool-down starts) or
   :meth:`~RatioController.failed` (a short retry delay instead);
   :meth:`~RatioController.hold_off` starts a cool-down too (a router taking over the
   decisions from another);
4. :meth:`~RatioController.snapshot` shows the state (metrics, ``GET /v1/controller``).

Decision rules of :meth:`RatioController.decide`, in order:

1. *Blocked* (returns None; streaks and the queue baseline reset, since the cluster is in
   transition): a change is in flight, or any worker is draining. (:meth:`completed` and
   :meth:`failed` reset them too.)
2. *Verdicts* of this evaluation, from the window: ``ttft_miss`` = TTFT attainment <
   ``target``; ``tpot_miss`` likewise. A metric with fewer than ``min_samples`` samples has
   no attainment and no verdict. A failed request is a TTFT miss and no TPOT sample; a
   request with fewer than 2 output tokens is no TPOT sample.
3. *Queue growth*: when TTFT has no attainment (too few samples), the sum of
   ``queued_prefill_tokens`` over the workers that prefill (the prefill workers, or the
   decode workers when there is none) strictly above its value at the previous evaluation,
   while that queue would take more than :data:`QUEUE_WAIT_SHARE` of the TTFT SLO to clear
   at those workers' measured prefill speed, counts as TTFT pressure (a few short prompts
   queued behind decodes are no backlog). With the streak of rule 4, that is "strictly rising over
   ``patience`` consecutive evaluations": a backlog is seen before requests finish.
4. *Streaks* (hysteresis): the evaluation's verdict is ``ttft`` (TTFT pressure and no TPOT
   miss), ``tpot`` (TPOT miss and no TTFT pressure), ``both`` or ``ok``; a streak counts
   consecutive evaluations with the same verdict. Evaluations inside the cool-down count
   (the window then holds only samples taken after the last move, see below).
5. *Cool-down*: nothing moves until ``cooldown_s`` after the last completed change (or
   :data:`RETRY_DELAY_S`, at most ``cooldown_s``, after a failed one).
6. *Moves*, once a streak reaches ``patience``:
   ``ttft`` -> one decode worker becomes prefill, if #decode > ``min_decode`` and
   #prefill < ``max_prefill``; the one with the least work (running + waiting, then fewest
   used pages, then worker id). ``tpot`` -> one prefill worker becomes decode, if
   #prefill > ``min_prefill`` and #decode < ``max_decode``; the one with the fewest queued
   prefill tokens, then worker id. ``both`` -> no move: the cluster is short of hardware,
   and :meth:`~RatioController.snapshot` says so. A move resets the streaks.
7. Mixed workers are never moved, nor counted in either pool.

After a change completes, the window forgets every sample that finished before that
moment: they measured the old ratio (or the drain), and judging the new ratio by them would
move again at once, i.e. flap. The cool-down gives the new ratio time to fill the window.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from router.control.ratio_config import RatioConfig
from router.control.slo_window import SloWindow
from router.placement.policies import WorkerLoad

__all__ = ["RatioConfig", "RatioController", "RoleChange", "SloWindow"]

QUEUE_WAIT_SHARE = 0.5
"""A rising prefill queue is TTFT pressure once clearing it takes this share of the SLO."""

RETRY_DELAY_S = 10.0
"""After a failed change, the wait before the next one (capped by ``cooldown_s``)."""

VERDICTS = ("ok", "ttft", "tpot", "both")


@dataclass(frozen=True)
class RoleChange:
    """One decided move; ``at_s``: when it was decided (the caller's clock)."""

    worker_id: str
    from_role: str
    to_role: str
    reason: str
    at_s: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class _Pools:
    prefill: tuple[WorkerLoad, ...]
    decode: tuple[WorkerLoad, ...]

    @classmethod
    def of(cls, workers: Sequence[WorkerLoad]) -> _Pools:
        return cls(
            tuple(w for w in workers if w.role == "prefill"),
            tuple(w for w in workers if w.role == "decode"),
        )

    @property
    def queued_prefill_tokens(self) -> int:
        """Over the workers that prefill: the prefill pool, else the decode workers."""
        return sum(w.queued_prefill_tokens for w in self.prefill or self.decode)

    @property
    def queue_wait_s(self) -> float:
        """The queued prefill tokens at the prefilling workers' summed speed."""
        speed = sum(w.prefill_speed for w in self.prefill or self.decode)
        return self.queued_prefill_tokens / speed if speed else 0.0


class RatioController:
    """The rules of the module docstring; one instance per router (or simulated cluster)."""

    def __init__(self, config: RatioConfig) -> None:
        self.config = config
        self.window = SloWindow(
            config.ttft_slo_s, config.tpot_slo_s, config.window_s, config.min_samples
        )
        self._history: list[RoleChange] = []
        self._in_flight: RoleChange | None = None
        self._quiet_until = -math.inf  # no change before this (cool-down or retry delay)
        self._verdict = "ok"
        self._streak = 0
        self._queue: int | None = None  # prefill queue at the previous evaluation
        self._queue_growing = False
        self._blocked = ""  # why the last evaluation moved nothing, when it had a reason to

    @property
    def history(self) -> tuple[RoleChange, ...]:
        """Every change decided so far, oldest first."""
        return tuple(self._history)

    @property
    def in_flight(self) -> RoleChange | None:
        return self._in_flight

    def record(self, finished_s: float, ttft_s: float | None, tpot_s: float | None) -> None:
        """One finished request (``ttft_s`` None: it failed; ``tpot_s`` None: no sample)."""
        self.window.add(finished_s, ttft_s, tpot_s)

    def decide(self, now_s: float, workers: Sequence[WorkerLoad]) -> RoleChange | None:
        """The change to make now, if any (rules 1-7 of the module docstring); a returned
        change is in flight until :meth:`completed` or :meth:`failed`."""
        draining = [w.worker_id for w in workers if w.draining]
        if self._in_flight is not None or draining:
            self._reset()
            self._blocked = (
                f"waiting for {self._in_flight.worker_id} to become {self._in_flight.to_role}"
                if self._in_flight is not None
                else f"draining: {', '.join(draining)}"
            )
            return None
        cfg = self.config
        pools = _Pools.of(workers)
        ttft, tpot, _ = self.window.attainment(now_s)
        queue = pools.queued_prefill_tokens
        growing = (
            ttft is None
            and self._queue is not None
            and queue > self._queue
            and pools.queue_wait_s > cfg.ttft_slo_s * QUEUE_WAIT_SHARE
        )
        self._queue, self._queue_growing = queue, growing
        ttft_pressure = growing or (ttft is not None and ttft < cfg.target)
        tpot_miss = tpot is not None and tpot < cfg.target
        verdict = VERDICTS[int(ttft_pressure) + 2 * int(tpot_miss)]
        self._streak = self._streak + 1 if verdict == self._verdict else 1
        self._verdict = verdict
        self._blocked = ""
        if verdict == "ok":
            return None
        if verdict == "both":
            self._blocked = "TTFT and TPOT both miss: short of hardware, no move helps"
            return None
        if self._streak < cfg.patience:
            self._blocked = f"{verdict} pressure for {self._streak}/{cfg.patience} evaluations"
            return None
        if now_s < self._quiet_until:
            self._blocked = f"cool-down for {self._quiet_until - now_s:.1f} s more"
            return None
        if verdict == "ttft":
            basis = (
                f"prefill queue rising to {queue} tokens, too few TTFT samples"
                if growing
                else f"ttft attainment {ttft:.2f} < {cfg.target:.2f}"
            )
            change = self._to_prefill(pools, f"{basis} (tpot {_fmt(tpot)})", now_s)
        else:
            reason = f"tpot attainment {tpot:.2f} < {cfg.target:.2f} (ttft {_fmt(ttft)})"
            change = self._to_decode(pools, reason, now_s)
        if change is not None:
            self._in_flight = change
            self._history.append(change)
            self._reset()
        return change

    def _to_prefill(self, pools: _Pools, reason: str, now_s: float) -> RoleChange | None:
        cfg = self.config
        if len(pools.decode) <= cfg.min_decode or len(pools.prefill) >= cfg.max_prefill:
            self._blocked = (
                f"TTFT pressure, but {len(pools.decode)} decode (min {cfg.min_decode}) and "
                f"{len(pools.prefill)} prefill (max {cfg.max_prefill}) workers"
            )
            return None
        worker = min(
            pools.decode,
            key=lambda w: (w.running + w.waiting, w.total_pages - w.free_pages, w.worker_id),
        )
        return RoleChange(worker.worker_id, "decode", "prefill", reason, now_s)

    def _to_decode(self, pools: _Pools, reason: str, now_s: float) -> RoleChange | None:
        cfg = self.config
        if len(pools.prefill) <= cfg.min_prefill or len(pools.decode) >= cfg.max_decode:
            self._blocked = (
                f"TPOT pressure, but {len(pools.prefill)} prefill (min {cfg.min_prefill}) and "
                f"{len(pools.decode)} decode (max {cfg.max_decode}) workers"
            )
            return None
        worker = min(pools.prefill, key=lambda w: (w.queued_prefill_tokens, w.worker_id))
        return RoleChange(worker.worker_id, "prefill", "decode", reason, now_s)

    def completed(self, change: RoleChange, now_s: float) -> None:
        """``change`` is done (the worker drained and switched): the cool-down starts, and
        the window forgets the samples of the old ratio."""
        self._end(change)
        self._quiet_until = now_s + self.config.cooldown_s
        self.window.clear_before(now_s)

    def failed(self, change: RoleChange, now_s: float) -> None:
        """``change`` did not happen; the next one may come after :data:`RETRY_DELAY_S`."""
        self._end(change)
        self._quiet_until = now_s + min(self.config.cooldown_s, RETRY_DELAY_S)

    def hold_off(self, now_s: float) -> None:
        """Nothing moves until ``cooldown_s`` after ``now_s``, and the window forgets the
        samples before it, as after a completed change: this router's controller has just
        taken over from another (:mod:`router.control.lease`), which may have just
        moved a worker (its history is not shared)."""
        self._quiet_until = max(self._quiet_until, now_s + self.config.cooldown_s)
        self.window.clear_before(now_s)
        self._reset()

    def _end(self, change: RoleChange) -> None:
        if change != self._in_flight:
            raise ValueError(f"{change} is not the change in flight ({self._in_flight})")
        self._in_flight = None
        self._reset()

    def _reset(self) -> None:
        self._verdict, self._streak = "ok", 0
        self._queue, self._queue_growing = None, False

    def snapshot(self, now_s: float) -> dict[str, Any]:
        """The state at ``now_s``, JSON-ready (for metrics and ``GET /v1/controller``)."""
        ttft, tpot, _ = self.window.attainment(now_s)
        n_ttft, n_tpot = self.window.counts(now_s)
        return {
            "ttft_attainment": ttft,
            "tpot_attainment": tpot,
            "samples": {"ttft": n_ttft, "tpot": n_tpot},
            "verdict": self._verdict,
            "streaks": {v: self._streak if v == self._verdict else 0 for v in VERDICTS[1:]},
            "short_of_hardware": self._verdict == "both",
            "prefill_queue_tokens": self._queue,
            "queue_growing": self._queue_growing,
            "in_flight": None if self._in_flight is None else self._in_flight.as_dict(),
            "cooldown_remaining_s": max(0.0, self._quiet_until - now_s),
            "blocked": self._blocked or None,
        }


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"

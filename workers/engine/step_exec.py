"""One scheduled batch through the model, with failures contained to the request at fault.

:func:`execute_contained` plans the step's writes (the prefill half of the hand-off,
:class:`workers.handoff.prefill_side.PrefillHandoff`: the pool's and the direct push's, one
call), runs the model and samples (see
:meth:`workers.engine.model_runner.ModelRunner.execute`, which already isolates a failed sample).
If the model itself raises, the step's writes are abandoned (nothing half-written becomes
visible in the pool) and the batch runs again one request at a time: a request that fails
alone is blamed (logged with its id) and reported in ``failed``; the others get their token.
Nothing in the scheduler changes here: the caller finishes the failed requests (their pages
go back) and advances the rest, so every page stays accounted for.

A failure to plan or finish the pool writes is not a request's fault: it is logged and the
step's tokens stand without those writes (the pool is a cache; a decode worker recomputes
what it does not find).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from kvpool.stream import StepWrite, Transfer
from workers.core.scheduler import ScheduledBatch
from workers.engine.model_runner import ModelRunner, Sampled, describe
from workers.handoff.prefill_side import PrefillHandoff

log = logging.getLogger(__name__)


@dataclass
class Executed:
    """What a batch produced: its samples and the pool writes of each sub-step run."""

    sampled: Sampled = field(default_factory=Sampled)
    writes: list[tuple[Transfer, dict[str, int]]] = field(default_factory=list)
    """``(transfer, owners)`` per step written (owners: request id -> its blocks)."""

    def merge(self, other: Executed) -> None:
        self.sampled.merge(other.sampled)
        self.writes += other.writes


def execute_contained(
    runner: ModelRunner, writer: PrefillHandoff | None, batch: ScheduledBatch
) -> Executed:
    """Run ``batch`` (see the module docstring; ``writer``: None without the pool); never
    raises ``Exception``."""
    try:
        return _execute(runner, writer, batch)
    except Exception as exc:
        if len(batch.entries) == 1:
            seq = batch.entries[0].seq
            log.exception("the engine failed on %s alone; it is blamed and fails", seq.request_id)
            return Executed(Sampled(failed=[(seq, describe(exc))]))
        log.exception("a step of %d requests failed; running them one by one", len(batch.entries))
    result = Executed()
    for entry in batch.entries:
        result.merge(execute_contained(runner, writer, ScheduledBatch([entry])))
    return result


def _execute(runner: ModelRunner, writer: PrefillHandoff | None, batch: ScheduledBatch) -> Executed:
    write = _plan(writer, batch)
    try:
        sampled = runner.execute(batch, write.on_layer if write is not None else None)
    except BaseException:
        if write is not None:
            write.abandon()
        raise
    if write is None:
        return Executed(sampled)
    try:
        return Executed(sampled, [(write.finish(), write.owners)])
    except Exception:
        log.exception("finishing the step's pool writes failed; its tokens stand")
        return Executed(sampled)


def _plan(writer: PrefillHandoff | None, batch: ScheduledBatch) -> StepWrite | None:
    if writer is None:
        return None
    try:
        return writer.plan(batch.entries)
    except Exception:
        log.exception("planning the step's pool writes failed; the step runs without them")
        return None

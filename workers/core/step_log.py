"""A per-step record of an engine in service: what it ran and how long it took.

Lifecycle: :meth:`StepLog.open` (``None`` when no directory is configured) creates
``<dir>/steps-<pid>.jsonl``; the engine calls :meth:`StepLog.record` once per step with the
batch's :meth:`~workers.core.scheduler.ScheduledBatch.shape` (taken before the step ran) and the
step's wall time (scheduling, model, pool writes, outputs: all that the worker's thread spent
on it); :meth:`StepLog.close` at shutdown. One JSON object per line:
``{"prefill": [[new, computed], ...], "decode": [context, ...], "seconds": s}``, the
format ``kvserve sim calibrate --from-step-logs`` reads. Lines are flushed as written, so a
worker that is killed leaves whole lines.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TextIO


class StepLog:
    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    @classmethod
    def open(cls, directory: str) -> StepLog | None:
        if not directory:
            return None
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        return cls((path / f"steps-{os.getpid()}.jsonl").open("a", buffering=1))

    def record(
        self, shape: tuple[tuple[tuple[int, int], ...], tuple[int, ...]], seconds: float
    ) -> None:
        prefill, decode = shape
        line = {"prefill": [list(p) for p in prefill], "decode": list(decode), "seconds": seconds}
        self._stream.write(json.dumps(line) + "\n")

    def close(self) -> None:
        self._stream.close()

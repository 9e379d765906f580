"""A worker as the router sees it: its registry record, the stub to call it, and whether
this router holds it (:meth:`router.placement.worker_view.WorkerView.hold`). Built only by
:class:`router.placement.worker_view.WorkerView` from records that passed the registry's MAC and
schema checks; read by placement (:meth:`LiveWorker.load`), flows and the P:D controller."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvpool.layout import token_bytes
from proto.registry import WorkerRecord
from router.placement.policies import WorkerLoad

if TYPE_CHECKING:  # typing-only class of the generated stubs
    from proto.worker_pb2_grpc import WorkerAsyncStub


@dataclass(frozen=True)
class LiveWorker:
    """A registered worker and the stub to call it."""

    record: WorkerRecord
    stub: WorkerAsyncStub
    held: bool = False
    """The router places no new work on it (see :meth:`WorkerView.hold`)."""

    @property
    def worker_id(self) -> str:
        return self.record.worker_id

    @property
    def role(self) -> str:
        return record_role(self.record)

    @property
    def draining(self) -> bool:
        """Draining by its own report, or held by this router."""
        return self.held or record_draining(self.record)

    @property
    def serves_requests(self) -> bool:
        """Can decode (decode or mixed role) and is not draining."""
        return self.role in ("decode", "mixed") and not self.draining

    def load(self) -> WorkerLoad:
        """The conductor's view; missing fields are 0 (protobuf's JSON form omits defaults
        and writes 64-bit integers as strings, hence the conversions)."""
        get = self.record.load.get
        return WorkerLoad(
            worker_id=self.worker_id,
            role=self.role,
            draining=self.draining,
            waiting=int(get("waiting", 0)),
            running=int(get("running", 0)),
            queued_prefill_tokens=int(float(get("queued_prefill_tokens", 0))),
            free_pages=int(get("free_pages", 0)),
            total_pages=int(get("total_pages", 0)),
            prefill_tokens_per_s=float(get("prefill_tokens_per_s", 0.0)),
            pool_fetch_tokens_per_s=self._fetch_speed(),
            report_at=self.record.heartbeat_at,
        )

    def _fetch_speed(self) -> float:
        """Tokens of KV per second its landings read from the pool (0: none yet, or a
        contract that names no layout)."""
        get = self.record.load.get
        seconds = float(get("kv_read_seconds", 0.0))
        read = float(get("kv_bytes_read", 0))
        try:
            per_token = token_bytes(self.record.contract.rpartition("|")[2])
        except ValueError:
            return 0.0
        return read / per_token / seconds if seconds > 0 and read > 0 else 0.0


def record_role(record: WorkerRecord) -> str:
    """The role in the latest load report (roles change at run time), else the record's."""
    return str(record.load.get("role") or record.role)


def record_draining(record: WorkerRecord) -> bool:
    return bool(record.load.get("draining", False))

"""The simulated cluster's small types: its timing, a request in flight, a role move."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvserve.loadgen.metrics import RequestRecord
from kvserve.loadgen.workloads import RequestSpec
from proto.registry import ClusterConfig
from router.config import RouterConfig
from router.control.ratio import RoleChange


@dataclass(frozen=True)
class Timing:
    """Router-side delays: one message between processes, and the load view's staleness."""

    hop_s: float = 0.001
    heartbeat_s: float = ClusterConfig.heartbeat_s
    controller_interval_s: float = RouterConfig.controller_interval_s

    def __post_init__(self) -> None:
        if self.hop_s < 0 or self.heartbeat_s <= 0 or self.controller_interval_s <= 0:
            raise ValueError(f"timing must be hop_s >= 0 and positive periods, got {self}")


@dataclass
class SimRequest:
    """One request as the simulated router follows it (times on the simulation clock)."""

    spec: RequestSpec
    start_s: float
    chunks: list[float] = field(default_factory=list)
    cached_tokens: int = 0
    error: str | None = None
    status: int | None = None
    end_s: float = 0.0

    def record(self, base: float) -> RequestRecord:
        """What the load generator would have recorded, times counted from ``base``."""
        spec = self.spec
        ok = self.error is None
        return RequestRecord(
            index=spec.index,
            arrival_s=spec.arrival_s,
            prompt_len=spec.prompt_len,
            max_tokens=spec.max_tokens,
            group=spec.group,
            start_s=self.start_s - base,
            end_s=self.end_s - base,
            chunk_times_s=tuple(t - base for t in self.chunks),
            output_tokens=len(self.chunks),
            prompt_tokens=spec.prompt_len if ok else None,
            cached_tokens=self.cached_tokens if ok else None,
            error=self.error,
            status_code=self.status,
        )


@dataclass(frozen=True)
class RoleEvent:
    """A role move as it happened: decided at ``at_s``, switched at ``done_s``."""

    change: RoleChange
    done_s: float

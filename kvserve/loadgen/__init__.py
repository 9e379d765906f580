"""The serving load generator: workloads, arrivals, an async OpenAI client, metrics, SLOs.

Pure modules (:mod:`.workloads`, :mod:`.conversation`, :mod:`.arrivals`, :mod:`.metrics`,
:mod:`.slo`) import no I/O library and no torch, so a simulator can reuse the requests and the
JSON schema; :mod:`.client`, :mod:`.conversation_client` and :mod:`.counters` talk HTTP
(aiohttp) and :mod:`.plots` draws (matplotlib, lazily).
"""

from kvserve.loadgen.metrics import RequestRecord, RunSummary, summarize
from kvserve.loadgen.slo import AbsoluteSlo, RelativeSlo, SloTargets, sweep_goodput
from kvserve.loadgen.workloads import RequestSpec

__all__ = [
    "AbsoluteSlo",
    "RelativeSlo",
    "RequestRecord",
    "RequestSpec",
    "RunSummary",
    "SloTargets",
    "summarize",
    "sweep_goodput",
]

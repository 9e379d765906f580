"""The pool's outage breaker: whether a member may call the Mooncake binding now.

While the master is gone (killed or restarting) the binding answers every verb with an error
code (a put may first retry for seconds), and its own ping thread remounts the member's
segment once the master is back. So :meth:`OutageBreaker.check` opens the breaker when a
verb failed and the master is known to be gone (:data:`RPC_FAIL`, or the client reports
itself unhealthy); for :data:`OUTAGE_BACKOFF_S` :meth:`OutageBreaker.allows` then says no at
once, without a call (reads miss, writes are not committed: the pool is a cache, callers
recompute); after that, one probe (the master's port, then the client's health) decides
whether to close it or wait again. A verb refused for want of space
(:data:`kvpool.tiers.NO_SPACE`) is a failed verb, never an outage.

One breaker per :class:`kvpool.store.MooncakeStore`, for the member's life.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from kvpool.net import port_open
from kvpool.tiers import NO_SPACE

log = logging.getLogger(__name__)

MASTER_PROBE_S = 2.0
"""How long joining the pool waits for the master's port to answer before giving up (a
probe of a breaker waits a quarter of it)."""
OUTAGE_BACKOFF_S = 1.0
"""While the pool is out, verbs fail at once for this long between health probes (the
client remounts within about a second of the master's return, as observed here)."""
RPC_FAIL = -900
"""The binding's code for a failed call to the master (it is gone, or restarting)."""


class OutageBreaker:
    """``healthy``: the client's own health flag; ``master``: ``(host, port)`` of the
    master's RPC service, probed before the breaker closes (None: not probed, as for masters
    in HA mode); ``clock``: monotonic seconds."""

    def __init__(
        self,
        healthy: Callable[[], bool],
        master: tuple[str, int] | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._healthy = healthy
        self._master = master
        self._clock = clock
        self.outages = 0
        """Outages seen since start (each opened the breaker once)."""
        self._retry_at = 0.0  # 0: closed; else when the next probe may run

    @property
    def open(self) -> bool:
        """Whether an outage was seen and the pool not found back yet (no probe, no RPC)."""
        return bool(self._retry_at)

    def allows(self) -> bool:
        """Whether the pool can be used now (probes it when the backoff has passed)."""
        if not self._retry_at:
            return True
        if self._clock() < self._retry_at:
            return False
        if self._master_answers() and self._healthy():
            self._retry_at = 0.0
            log.warning("the KV pool is reachable again: using it")
            return True
        self._retry_at = self._clock() + OUTAGE_BACKOFF_S
        return False

    def _master_answers(self) -> bool:
        """Whether the master's port accepts a connection (the client's own health flag
        can say "healthy" while the master is still down)."""
        return self._master is None or port_open(*self._master, timeout=MASTER_PROBE_S / 4)

    def check(self, codes: list[int]) -> list[int]:
        """``codes`` (a verb's answers), having opened the breaker when a call to the
        master failed, or a verb failed for another reason than
        :data:`~kvpool.tiers.NO_SPACE` and the client says the master is gone."""
        failed = any(c < 0 and c != NO_SPACE for c in codes)
        if failed and not self._retry_at and (RPC_FAIL in codes or not self._healthy()):
            self._retry_at = self._clock() + OUTAGE_BACKOFF_S
            self.outages += 1
            log.warning("the KV pool is unreachable: serving without it until it returns")
        return codes

"""The P:D controller's lease: which one of the cluster's routers may move workers now.

Several routers may run with ``--controller``; their controllers must not decide at once
(each would see the same SLO misses and move a worker of its own). So a controller decides
only while it holds this lease: one Redis key, :func:`lease_key` (``<cluster>:controller``,
in the cluster's key namespace, beside ``<cluster>:worker:<id>``), whose value is the
holder's router id (:meth:`router.config.RouterConfig.resolved_router_id`) and whose TTL is
:func:`lease_ttl_s` (3 controller intervals, at least :data:`MIN_TTL_S`).

Lifecycle of a :class:`ControllerLease` (its methods block: callers on an event loop run
them in a thread; none raises on a Redis failure):

1. built with the cluster's settings (its client: :func:`proto.registry.connect`, so plain,
   TLS or ``redis+sentinel://`` URLs alike, with the cluster's credentials) and this
   router's id; nothing is sent yet;
2. :meth:`~ControllerLease.take`, once per controller interval: renews the lease if this
   router holds it (a Lua compare-and-set: the TTL is reset iff the value is this id),
   else takes it if it is free (``SET key id NX PX ttl``); answers whether it is held
   now. Each successful ``SET`` starts a new term (:attr:`~ControllerLease.term`): the
   caller waits a cool-down before its first decision of a term, since the previous
   holder may have just moved a worker. A failed renewal (expired, taken by another, or
   Redis unreachable) means not held, at once: the holder stops deciding within one
   interval, while a successor can take over only once the TTL has run out;
3. :meth:`~ControllerLease.release` on a clean shutdown deletes the key iff it still holds
   this id (Lua again), so a successor takes over at its next interval, not a TTL later;
4. :meth:`~ControllerLease.close` closes the client.

:meth:`~ControllerLease.look` reads the holder at any time (``GET /v1/controller``).

A Redis failure is logged (at most every :data:`LOG_EVERY_S`) and counts as not holding.
Two routers given the same id would both hold it: ids must be unique (``--router-id``).
The scripts need Redis's scripting commands (``EVALSHA``/``EVAL``: ACL category
``@scripting``) on the cluster's Redis user.
"""

from __future__ import annotations

import logging
import math
import threading
import time

import redis

from proto.registry import ClusterConfig, connect, explain

log = logging.getLogger(__name__)

TTL_INTERVALS = 3
"""The lease lives this many controller intervals unrenewed (one missed renewal is no loss)."""
MIN_TTL_S = 3.0
"""The least TTL, whatever the interval: a Redis round trip or a slow event loop must not
cost a holder its lease."""
IO_TIMEOUT_S = 1.0
"""Connect and reply timeout of the lease's Redis calls (well under :data:`MIN_TTL_S`)."""
LOG_EVERY_S = 60.0

RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
"""Reset the lease's TTL (ARGV[2] ms) iff its value is ARGV[1]; 1 if so, else 0."""
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""
"""Delete the lease iff its value is ARGV[1]; 1 if so, else 0."""


def lease_key(cluster: str) -> str:
    """The lease's Redis key in cluster ``cluster``'s namespace."""
    return f"{cluster}:controller"


def lease_ttl_s(interval_s: float) -> float:
    """The lease's TTL for a controller evaluating every ``interval_s`` seconds:
    :data:`TTL_INTERVALS` intervals, at least :data:`MIN_TTL_S`."""
    return max(MIN_TTL_S, TTL_INTERVALS * interval_s)


class ControllerLease:
    """One router's handle on the lease (module docstring). Thread-safe: one call at a
    time (a lock); the attributes may be read from any thread."""

    def __init__(self, cluster: ClusterConfig, holder_id: str, ttl_s: float) -> None:
        """The lease of ``cluster`` for router ``holder_id``, with a TTL of ``ttl_s`` (the
        router's: :func:`lease_ttl_s`) and a client of its own: :data:`IO_TIMEOUT_S`, no
        retries (a renewal must answer well within the TTL, or count as failed)."""
        if not (math.isfinite(ttl_s) and ttl_s > 0):
            raise ValueError(f"ttl_s must be a positive number of seconds, got {ttl_s}")
        self.cluster = cluster
        self.client = connect(cluster, IO_TIMEOUT_S, IO_TIMEOUT_S, retry=False)
        self.key = lease_key(cluster.cluster)
        self.holder_id = holder_id
        self.ttl_ms = max(1, round(ttl_s * 1000))
        self.held = False
        """Whether this router held the lease at its last :meth:`take` or :meth:`release`."""
        self.holder: str | None = None
        """The holder seen at the last call (None: nobody, or Redis unreadable)."""
        self.term = 0
        """How many times this router has taken the lease (each a new term)."""
        self._renew = self.client.register_script(RENEW)
        self._release = self.client.register_script(RELEASE)
        self._lock = threading.Lock()
        self._quiet_until = 0.0

    def take(self) -> bool:
        """Renew the lease if held here, else take it if free (lifecycle step 2); whether
        this router holds it now. False on any Redis failure (logged)."""
        with self._lock:
            try:
                if self._renew(keys=[self.key], args=[self.holder_id, self.ttl_ms]) == 1:
                    self.held, self.holder = True, self.holder_id
                    return True
                if self.client.set(self.key, self.holder_id, nx=True, px=self.ttl_ms):
                    self.held, self.holder = True, self.holder_id
                    self.term += 1
                    return True
                self.held, self.holder = False, _text(self.client.get(self.key))
            except (redis.RedisError, OSError) as exc:
                self.held, self.holder = False, None
                self._warn(f"P:D controller lease unavailable, not deciding: {self._why(exc)}")
            return False

    def look(self) -> str | None:
        """Read the holder now into :attr:`holder` and answer it (None: nobody, or Redis
        unreadable: logged). Leaves :attr:`held` as it is (only :meth:`take` decides it)."""
        with self._lock:
            try:
                self.holder = _text(self.client.get(self.key))
            except (redis.RedisError, OSError) as exc:
                self.holder = None
                self._warn(f"P:D controller lease unreadable: {self._why(exc)}")
            return self.holder

    def release(self) -> bool:
        """Give the lease up if held here (lifecycle step 3); whether it was deleted.
        False on a Redis failure (logged; the lease then expires with its TTL)."""
        with self._lock:
            was, self.held = self.held, False
            try:
                deleted = self._release(keys=[self.key], args=[self.holder_id]) == 1
            except (redis.RedisError, OSError) as exc:
                if was:
                    log.warning("P:D controller lease not released (it expires in %.1f s): %s",
                                self.ttl_ms / 1000, self._why(exc))  # fmt: skip
                return False
            if deleted:
                self.holder = None
            return bool(deleted)

    def close(self) -> None:
        """Close the client (lifecycle step 4)."""
        self.client.close()

    def _why(self, exc: BaseException) -> str:
        return explain(self.cluster, exc)

    def _warn(self, message: str) -> None:
        """Log ``message`` at most every :data:`LOG_EVERY_S` (a Redis outage would log
        once per controller interval otherwise)."""
        now = time.monotonic()
        if now >= self._quiet_until:
            self._quiet_until = now + LOG_EVERY_S
            log.warning("%s", message)


def _text(value: bytes | str | None) -> str | None:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return value

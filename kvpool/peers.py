"""Pool members this member could not reach lately: reads skip what only they hold.

A member whose host went away (a cut link, a powered-off machine) stays in the master's
lists until its client lease runs out, and a read of an object in its segment is a
transfer to it. The first such read fails within ``pool_transfer_timeout_s`` (Mooncake's
TCP transport drops a connection that makes no progress). The next one needs a new
connection, and Mooncake's lane keeps dialling a host that does not answer while the
store's batch waits up to 60 s (a fixed limit of the binding, spinning a core): seen with
a decode host cut off mid-load (``tests/e2e/test_disaggregated.py``), where a surviving
decode worker's engine thread, reading a migrated request's blocks, stalled 48-60 s with
every request it held.

So :class:`UnreachablePeers` remembers, for :data:`UNREACHABLE_S`, the transfer endpoints
of the objects whose read failed with :data:`TRANSFER_FAIL`; while any is remembered, a
read first asks the master where its objects are (one batched call) and skips those whose
every copy in memory lies on such an endpoint: they are misses (the caller recomputes), not
60-second stalls. With nobody remembered a read costs nothing more. Lifecycle: one per
:class:`~kvpool.store.MooncakeStore`; :meth:`UnreachablePeers.tryable` before each read,
:meth:`UnreachablePeers.note` after one that failed.

One batched read can also hold both objects on live connections (failed at once) and one
needing a new connection, which waits the 60 s itself (seen in about one run in five of that
test, a read of block metas). Reads of values (:meth:`~kvpool.store.MooncakeStore.get_bytes`,
whose buffers are the binding's own) are therefore given up after twice the transfer timeout:
the call ends in the background, its keys answer as misses, and every member holding them is
remembered as for a failed transfer (which of them held the call up is not known: a live one
among them costs recomputed blocks for a while, not a stall). Reads into the caller's memory
(``get_into``) are not bounded this way: their pages would have to be held back until the
abandoned transfer ends.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

log = logging.getLogger(__name__)

TRANSFER_FAIL = -800
"""The binding's code for a read whose transfer failed (the peer holding it did not
answer in time)."""
UNREACHABLE_S = 30.0
"""How long a member whose transfer failed is skipped: what it alone holds is recomputed
meanwhile, never waited for (a member that was only slow for a moment costs that much).
Three times the master's default client TTL (:attr:`kvpool.master.MasterConfig.master_client_ttl_s`,
10 s), after which the master has unmounted a silent member's segment (seen 10 s after a
cut), so no read is sent its way again."""

Replicas = Mapping[str, Sequence[Any]]
"""Per key, its replica descriptors as ``batch_get_replica_desc`` gives them."""


def memory_endpoints(replicas: Sequence[Any], complete: bool = False) -> list[str]:
    """The transfer endpoints of the in-memory copies among ``replicas`` (``complete``:
    only those written in full, as a read would find them)."""
    return [
        str(r.get_memory_descriptor().buffer_descriptor.transport_endpoint)
        for r in replicas
        if r.is_memory_replica() and (not complete or r.status.name == "COMPLETE")
    ]


class UnreachablePeers:
    """Endpoints whose transfers failed within the last :data:`UNREACHABLE_S` (module
    docstring), for the reads of one member's ``client`` (the binding's store client), made
    from any thread (the engine's, the lander's, the writers')."""

    def __init__(self, client: Any, clock: Callable[[], float] = time.monotonic) -> None:
        self._client = client
        self._clock = clock
        self._lock = threading.Lock()
        self._until: dict[str, float] = {}
        self.skipped = 0
        """Objects not tried because only an unreachable member held them."""

    def current(self) -> set[str]:
        """The endpoints skipped now (the expired ones forgotten)."""
        now = self._clock()
        with self._lock:
            self._until = {e: t for e, t in self._until.items() if t > now}
            return set(self._until)

    def tryable(self, keys: Sequence[str]) -> list[int]:
        """The indices of ``keys`` a read may try now: all, unless a member is unreachable;
        then (one RPC) those with an in-memory copy elsewhere, or none in memory at all (the
        read decides: a miss, or the SSD tier)."""
        skipped = self.current()
        if not skipped:
            return list(range(len(keys)))
        replicas = self._replicas(keys)
        out = []
        for i, key in enumerate(keys):
            endpoints = memory_endpoints(replicas.get(key) or ())
            if not endpoints or any(e not in skipped for e in endpoints):
                out.append(i)
        with self._lock:
            self.skipped += len(keys) - len(out)
        return out

    def note(self, failed: Sequence[str], why: str = "did not answer a read") -> None:
        """Remember the endpoints holding the in-memory copies of ``failed``, keys whose
        transfer just failed or whose read was given up (never this member's own: its copies
        are read without one); one warning per endpoint not remembered yet, saying ``why``."""
        if not failed:
            return
        replicas, own = self._replicas(failed), str(self._client.get_hostname())
        silent = {  # an object still being written was a miss, not a failure
            endpoint
            for key in failed
            for endpoint in memory_endpoints(replicas.get(key) or (), complete=True)
        } - {own}
        until, known = self._clock() + UNREACHABLE_S, self.current()
        with self._lock:
            self._until.update(dict.fromkeys(silent, until))
        for endpoint in sorted(silent - known):
            log.warning(
                "KV pool member %s %s: what it alone holds is skipped for %.0f s "
                "(recomputed)", endpoint, why, UNREACHABLE_S
            )  # fmt: skip

    def _replicas(self, keys: Sequence[str]) -> Replicas:
        """Where the master says ``keys`` are (one RPC; nothing when it cannot say)."""
        try:
            found: Replicas = self._client.batch_get_replica_desc(list(keys))
        except Exception:  # the binding's own error types: the master is unreachable
            log.debug("replica lookup failed", exc_info=True)
            return {}
        return found

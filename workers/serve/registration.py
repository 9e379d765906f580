"""A worker's presence in the cluster registry (Redis), kept alive by heartbeats.

Lifecycle: ``Heartbeat(...)`` (its Redis client comes from :func:`proto.registry.connect`,
with the cluster's credentials) -> :meth:`Heartbeat.beat` once at start (raises
:class:`proto.registry.ContractMismatchError` for a worker that does not fit the cluster,
:class:`proto.registry.RegistryAccessError` when Redis refuses its credentials, or
``redis.RedisError`` when Redis is unreachable) -> :meth:`Heartbeat.start` publishes the
record and its load report every ``heartbeat_s`` on a thread (a failed beat is logged and
retried at the next one: a Redis restart is healed within one beat) -> :meth:`Heartbeat.stop`
withdraws the record.

The heartbeat says the process lives; the load report is as fresh as the engine allows.
``load`` must give up after about ``heartbeat_s`` (raising ``TimeoutError``) when the
engine thread is busy, e.g. with a pool transfer to a frozen peer; the beat then publishes
the last report it has, so a worker that is slow for a few seconds stays in the router's
view (its requests wait) instead of vanishing from it (they would fail). A report that
the record schema refuses (:func:`proto.records.check_load`; readers would drop the whole
record) is logged and replaced by the last one too.

What the beat writes carries a MAC keyed with the cluster secret (``cluster.keys``), and so
does the contract it claims: readers drop records without a valid one, and a contract
without one is overwritten instead of refusing this worker (:mod:`proto.record_store`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import redis

from proto.registry import (
    ClusterConfig,
    ContractMismatchError,
    RecordError,
    RegistryAccessError,
    WorkerRecord,
    connect,
    explain,
    publish,
    withdraw,
)

log = logging.getLogger(__name__)


class Heartbeat:
    def __init__(
        self,
        cluster: ClusterConfig,
        record: WorkerRecord,
        load: Callable[[], dict[str, Any]],
    ) -> None:
        self.cluster = cluster
        self.record = record
        self.load = load
        self.client = connect(
            cluster, socket_timeout=cluster.heartbeat_s, socket_connect_timeout=1.0
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)

    def beat(self) -> None:
        """Publish the record with a fresh load report now (the last one if the engine does
        not answer in time or its report is refused: see the module docstring)."""
        try:
            self.record = replace(self.record, heartbeat_at=time.time(), load=self.load())
        except (TimeoutError, RecordError) as exc:
            why = "engine busy" if isinstance(exc, TimeoutError) else f"load report refused: {exc}"
            log.warning("%s; the heartbeat carries the last load report", why)
            self.record = replace(self.record, heartbeat_at=time.time())
        try:
            publish(self.client, self.cluster.keys, self.record, self.cluster.heartbeat_ttl_s)
        except (redis.AuthenticationError, redis.exceptions.NoPermissionError) as exc:
            raise RegistryAccessError(explain(self.cluster, exc)) from exc

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.cluster.heartbeat_s):
            try:
                self.beat()
            except (ContractMismatchError, RegistryAccessError) as exc:
                log.error("%s", exc)
            except (redis.RedisError, OSError) as exc:
                log.warning("heartbeat failed: %s", explain(self.cluster, exc))

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self.cluster.heartbeat_s + 2)
        try:
            withdraw(self.client, self.cluster.keys, self.record.worker_id)
        except (redis.RedisError, OSError) as exc:
            log.warning("could not withdraw from the registry: %s", explain(self.cluster, exc))
        self.client.close()

"""A worker's presence in the cluster registry (Redis), kept alive by heartbeats.

Lifecycle: ``Heartbeat(...)`` -> :meth:`Heartbeat.beat` once at start (raises
:class:`proto.registry.ContractMismatchError` for a worker that does not fit the cluster,
or ``redis.RedisError`` when Redis is unreachable) -> :meth:`Heartbeat.start` publishes the
record and its load report every ``heartbeat_s`` on a thread (a failed beat is logged and
retried at the next one: a Redis restart is healed within one beat) -> :meth:`Heartbeat.stop`
withdraws the record.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import redis

from proto.registry import ClusterConfig, ContractMismatchError, WorkerRecord, publish, withdraw

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
        self.client = redis.Redis.from_url(
            cluster.redis_url, socket_timeout=cluster.heartbeat_s, socket_connect_timeout=1.0
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)

    def beat(self) -> None:
        """Publish the record with a fresh load report now."""
        self.record = replace(self.record, heartbeat_at=time.time(), load=self.load())
        publish(self.client, self.cluster.keys, self.record, self.cluster.heartbeat_ttl_s)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.cluster.heartbeat_s):
            try:
                self.beat()
            except ContractMismatchError as exc:
                log.error("%s", exc)
            except (redis.RedisError, OSError) as exc:
                log.warning("heartbeat to %s failed: %s", self.cluster.redis_url, exc)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self.cluster.heartbeat_s + 2)
        try:
            withdraw(self.client, self.cluster.keys, self.record.worker_id)
        except (redis.RedisError, OSError) as exc:
            log.warning("could not withdraw from the registry: %s", exc)
        self.client.close()

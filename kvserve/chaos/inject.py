"""The fault side of ``kvserve chaos`` (:mod:`kvserve.chaos.run`, step 2): one fault at a
time, each recorded with its detection and recovery times (:class:`FaultInjector`).

Detection, by fault: a worker killed or frozen, until the router stops counting it; the
master killed, until a worker reports the pool unreachable; with several masters
(``--pool-masters``), the leading one killed, until another leads, and a standby killed,
none (nothing serving notices); the Redis primary killed
(``--redis-ha``), until the Sentinels name another; one router of several killed, until
every round-robin slot of the balancer answers ``/health`` again (it routes around the dead
one); a lone Redis, none (its outage is served through). Recovery: from the fault until the
cluster is whole again (every worker routable and using the pool, a router back healthy).
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from collections.abc import Callable

from kvserve.chaos.report import FaultRecord
from kvserve.cluster import faults
from kvserve.cluster.health import http_ok
from kvserve.cluster.launch import Cluster
from kvserve.cluster.pool_ha import leader, wait_leader
from kvserve.cluster.redis_ha import RedisHA

WAIT_S = 60.0
"""Longest wait for a detection or a recovery before it is recorded as not seen."""
TARGETS = {"master": "mooncake_master", "redis": "redis"}
"""The process a fault on a shared service hits (workers and routers: one at random)."""


def _until(check: Callable[[], bool], timeout: float = WAIT_S) -> float | None:
    """Seconds until ``check()`` holds, polled; None if it did not within ``timeout``."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if check():
            return time.monotonic() - t0
        time.sleep(0.05)
    return None


def _pool_connected(cluster: Cluster) -> list[bool]:
    out = []
    for name in cluster.worker_names:
        try:
            out.append(faults.load_of(cluster, name, 1.0).pool_connected)
        except Exception:  # a worker down counts as not connected
            out.append(False)
    return out


def next_fault(faults: list[str], order: str, rng: random.Random, made: int) -> str:
    """The next fault after ``made`` of them: in turn (``cycle``) or at random."""
    return faults[made % len(faults)] if order == "cycle" else rng.choice(faults)


class FaultInjector:
    """One fault at a time, at random, until the load is done (see the module docstring).

    It runs on the main thread, because it restarts processes: a child started from a
    helper thread would get its death signal when that thread ends
    (:func:`workers.serve.lifetime.die_with_parent`)."""

    def __init__(self, cluster: Cluster, args: argparse.Namespace, t0: float) -> None:
        self.cluster, self.args, self.t0 = cluster, args, t0
        self.rng = random.Random(args.seed + 1)
        self.records: list[FaultRecord] = []

    def run_until(self, done: threading.Event) -> None:
        while not done.wait(self.rng.expovariate(1 / self.args.fault_every_s)):
            kind = next_fault(self.args.faults, self.args.fault_order, self.rng, len(self.records))
            record = self._inject(kind, done)
            self.records.append(record)
            print(f"[chaos] {record}", file=sys.stderr, flush=True)

    def _workers(self, role: str) -> list[str]:
        return [n for n in self.cluster.worker_names if self.cluster.plan_of(n).role == role]

    def _target(self, what: str) -> str:
        if what in TARGETS:
            return TARGETS[what]
        if what == "master-leader":
            ha = self.cluster.spec.pool_ha
            assert ha is not None, "kill-master-leader needs several pool masters"
            return wait_leader(ha, WAIT_S)
        if what == "router":
            return self.rng.choice(self.cluster.routers.names)
        return self.rng.choice(self._workers(what))

    def _inject(self, kind: str, done: threading.Event) -> FaultRecord:
        cluster, args = self.cluster, self.args
        action, _, what = kind.partition("-")
        target = self._target(what)
        record = FaultRecord(kind, target, round(time.monotonic() - self.t0, 2))
        if what == "router":
            record.address = cluster.routers.urls[target].removeprefix("http://")
        live = faults.routable(cluster)
        ha = cluster.redis if isinstance(cluster.redis, RedisHA) else None
        primary = ha.named_primary() if ha is not None else None
        pool = cluster.spec.pool_ha
        leading = leader(pool) if pool is not None else None
        started = time.monotonic()
        if action == "freeze":
            faults.freeze(cluster, target)
        else:
            faults.kill(cluster, target)
        if what in ("decode", "prefill"):
            seen = _until(lambda: faults.routable(cluster) < live)
        elif what.startswith("master") and pool is not None:  # a standby: nobody notices
            led = target == leading
            seen = _until(lambda: leader(pool) not in (None, target)) if led else None
        elif what == "master":
            seen = _until(lambda: not all(_pool_connected(cluster)))
        elif what == "router":
            seen = _until(lambda: _balanced(cluster))
        elif ha is not None:  # the Sentinels name another primary
            seen = _until(lambda: ha.named_primary() not in (None, primary))
        else:
            seen = None  # a Redis outage is served through, by asking workers directly
        record.detected_s = None if seen is None else round(seen, 2)
        done.wait(args.freeze_s if action == "freeze" else args.down_s)
        if action == "freeze":
            faults.thaw(cluster, target)
        else:
            cluster.restart(target)
        whole = _until(lambda: _whole(cluster))
        if whole is not None:
            record.recovered_s = round(time.monotonic() - started, 2)
        return record


def _balanced(cluster: Cluster) -> bool:
    """Whether a ``/health`` through the balancer answers in every round-robin slot."""
    return all(http_ok(cluster.router_url + "/health", 2.0) for _ in cluster.routers.names)


def _whole(cluster: Cluster) -> bool:
    """Every worker routable and using the pool, every router healthy."""
    routers = cluster.routers
    workers = len(cluster.worker_names)
    return (
        faults.wait_routable(cluster, 0.0)
        and all(_pool_connected(cluster))
        and all(routers.healthy(name, workers) for name in routers.names)
    )

"""A cluster's routers: one, or several behind nginx (:mod:`kvserve.cluster.balancer`).

Lifecycle of :class:`Routers`:

1. built from the plan's router plans; with several, a :class:`Balancer` on
   ``router_port`` over them (its configuration under ``<log_dir>/balancer``);
2. :meth:`start` starts every router, then the balancer;
3. :meth:`healthy` says whether every router counts ``workers`` workers (``/health``), and
   the balancer answers ``/health`` too;
4. a router may be killed and started again by name (:meth:`processes`, :meth:`restart`):
   the balancer leaves out a router it cannot reach and tries it again after its
   ``fail_timeout``, so nothing is reconfigured;
5. :meth:`stop` stops the balancer first (no new connection reaches a router going away),
   then the routers, all at once under one grace period.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

from kvserve.cluster.balancer import Balancer
from kvserve.cluster.health import http_ok, router_workers
from kvserve.cluster.plan import ProcessPlan
from kvserve.cluster.processes import ManagedProcess
from kvserve.cluster.router_names import BALANCER


class Routers:
    """Every router of a cluster and, with several, the balancer (module docstring)."""

    def __init__(
        self,
        plans: Sequence[ProcessPlan],
        url: str,
        log_dir: Path,
        managed: Callable[[ProcessPlan], ManagedProcess],
    ) -> None:
        self.url = url
        self.urls = {p.name: f"http://{p.address}" for p in plans}
        self._routers = {p.name: managed(p) for p in plans}
        self._balancer: Balancer | None = None
        if len(plans) > 1:
            host, port = url.removeprefix("http://").rsplit(":", 1)
            upstreams = [p.address for p in plans]
            self._balancer = Balancer(log_dir / BALANCER, log_dir, host, int(port), upstreams)

    @property
    def processes(self) -> dict[str, ManagedProcess]:
        """Every router's process by name, and the balancer's as ``balancer``."""
        found = dict(self._routers)
        if self._balancer is not None:
            found[BALANCER] = self._balancer.process
        return found

    @property
    def names(self) -> list[str]:
        """The routers' names."""
        return list(self._routers)

    def start(self) -> None:
        for proc in self._routers.values():
            proc.start()
        if self._balancer is not None:
            self._balancer.start()

    def healthy(self, name: str, workers: int) -> bool:
        """Whether router ``name`` counts ``workers`` live workers, or (``balancer``) the
        balancer passes ``/health`` to a router."""
        if name == BALANCER:
            return http_ok(self.url + "/health", timeout=2.0)
        return router_workers(self.urls[name]) >= workers

    def restart(self, name: str, grace: float, workers: int, timeout: float) -> None:
        """Start router ``name`` (or the balancer) again and wait until it is healthy."""
        proc = self.processes[name]
        proc.stop(grace)
        if name == BALANCER and self._balancer is not None:
            self._balancer.start()
        else:
            proc.start()
        deadline = time.monotonic() + timeout
        while not self.healthy(name, workers):
            if not proc.running or time.monotonic() > deadline:
                raise proc.failure(f"was not healthy within {timeout:g}s")
            time.sleep(0.25)

    def stop(self, grace: float) -> None:
        if self._balancer is not None:
            self._balancer.stop(grace)
        for proc in self._routers.values():
            proc.terminate()
        deadline = time.monotonic() + grace
        for proc in self._routers.values():
            proc.stop(max(0.1, deadline - time.monotonic()))

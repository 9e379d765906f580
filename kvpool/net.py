"""Small TCP helpers shared by the pool client and the launchers.

They live in ``kvpool`` because :mod:`kvpool.store` needs :func:`port_open` (its breaker
probes the master's port) and ``kvpool`` may import only itself; ``kvserve`` (launchers,
probes, benchmarks) and the tests import them from here.
"""

from __future__ import annotations

import socket


def free_local_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on 127.0.0.1 right now (for tests and benchmarks)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def port_open(host: str, port: int, timeout: float = 0.2) -> bool:
    """Whether something accepts TCP connections at ``host:port`` now."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False

"""Small TCP helpers shared by the pool client and the launchers.

They live in ``kvpool`` because :mod:`kvpool.store` needs :func:`port_open` (its breaker
probes the master's port) and ``kvpool`` may import only itself; ``kvserve`` (launchers,
probes, benchmarks) and the tests import them from here.
"""

from __future__ import annotations

import os
import socket

PORTS_ENV = "KVSERVE_FREE_PORTS"
"""``LOW-HIGH``: the ports :func:`free_local_ports` hands out, in turn (unset: ones the OS
picks from its ephemeral range). Processes that pick ports at the same time each get a
range of their own (the test suite's processes do: tests/conftest.py), so that none picks a
port another picked and has not bound yet; ports below the ephemeral range (32768 on
Linux) are not taken by outgoing connections either."""

_turn: dict[tuple[int, int], int] = {}
"""Per range: where the next search starts (after the last port handed out)."""


def free_local_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on 127.0.0.1 right now (for tests and benchmarks):
    from :data:`PORTS_ENV`'s range when set, else the OS's choice."""
    span = _span(os.environ.get(PORTS_ENV, ""))
    if span is None:
        return _os_ports(n)
    low, high = span
    start, found = _turn.get(span, low), []
    for offset in range(high - low):
        port = low + (start - low + offset) % (high - low)
        if _bindable(port):
            found.append(port)
            if len(found) == n:
                _turn[span] = port + 1
                return found
    raise RuntimeError(f"{PORTS_ENV}: fewer than {n} free ports in {low}-{high}")


def _span(text: str) -> tuple[int, int] | None:
    """``LOW-HIGH`` parsed (HIGH excluded); None when empty; ValueError when malformed."""
    if not text:
        return None
    low, sep, high = text.partition("-")
    if not (sep and low.isdigit() and high.isdigit() and 0 < int(low) < int(high) <= 65536):
        raise ValueError(f"{PORTS_ENV} is LOW-HIGH with 0 < LOW < HIGH <= 65536, got {text!r}")
    return int(low), int(high)


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _os_ports(n: int) -> list[int]:
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

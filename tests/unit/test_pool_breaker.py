"""The pool's outage breaker (:mod:`kvpool.breaker`): what opens it, how long it stays open,
and the probe that closes it (its clock moved by hand; the master's port a real socket)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from kvpool.breaker import OUTAGE_BACKOFF_S, RPC_FAIL, OutageBreaker
from kvpool.tiers import NO_SPACE
from tests.fake_clock import Clock


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def listening() -> Iterator[tuple[str, int]]:
    """A port on loopback that accepts connections, as a live master's does."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield "127.0.0.1", server.getsockname()[1]


class Health:
    def __init__(self) -> None:
        self.ok = True

    def __call__(self) -> bool:
        return self.ok


def test_failures_open_it_only_when_the_master_is_gone(clock: Clock) -> None:
    health = Health()
    breaker = OutageBreaker(health, None, clock)
    assert breaker.check([0, -1]) == [0, -1]  # a failed verb, the client healthy
    assert breaker.check([NO_SPACE]) == [NO_SPACE]
    health.ok = False
    assert breaker.check([NO_SPACE, 0]) == [NO_SPACE, 0]  # wanting space is no outage
    assert (breaker.open, breaker.outages, breaker.allows()) == (False, 0, True)
    health.ok = True
    breaker.check([0, RPC_FAIL])  # a failed call to the master, whatever the client says
    assert (breaker.open, breaker.outages) == (True, 1)
    breaker.check([RPC_FAIL])  # one outage, however many verbs fail in it
    assert breaker.outages == 1


def test_it_says_no_without_a_probe_for_the_backoff_then_closes_on_one(
    clock: Clock, listening: tuple[str, int]
) -> None:
    health = Health()
    breaker = OutageBreaker(health, listening, clock)
    breaker.check([RPC_FAIL])
    health.ok = False  # a probe now would fail: the answers below are the backoff's
    clock.now += OUTAGE_BACKOFF_S * 0.99
    assert not breaker.allows() and breaker.open
    clock.now += OUTAGE_BACKOFF_S * 0.02
    assert not breaker.allows()  # probed: the client still unhealthy, backs off again
    health.ok = True
    clock.now += OUTAGE_BACKOFF_S * 0.99
    assert not breaker.allows()
    clock.now += OUTAGE_BACKOFF_S * 0.02
    assert breaker.allows() and not breaker.open and breaker.outages == 1


def test_a_master_whose_port_refuses_keeps_it_open(clock: Clock) -> None:
    with socket.socket() as bound:  # bound, never listening: connections are refused
        bound.bind(("127.0.0.1", 0))
        gone = "127.0.0.1", bound.getsockname()[1]
        breaker = OutageBreaker(Health(), gone, clock)  # the client says healthy
        breaker.check([RPC_FAIL])
        clock.now += OUTAGE_BACKOFF_S * 1.01
        assert not breaker.allows() and breaker.open

"""kvpool.net.free_local_ports with a range of its own (KVSERVE_FREE_PORTS, what the test
suite's processes get: tests/conftest.py): ports from the range only, distinct, never one
that is bound, each handed out once per turn through the range."""

from __future__ import annotations

import socket

import pytest

from kvpool import net


def span_of(low: int, size: int) -> str:
    return f"{low}-{low + size}"


def test_ports_come_from_the_range_in_turn_and_skip_a_bound_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    low = 19500  # below the ephemeral range and the spans of scripts/test.sh
    monkeypatch.setenv(net.PORTS_ENV, span_of(low, 8))
    monkeypatch.setattr(net, "_turn", {})
    with socket.socket() as held:
        held.bind(("127.0.0.1", low + 1))
        first = net.free_local_ports(3)
        assert first == [low, low + 2, low + 3]
        assert net.free_local_ports(2) == [low + 4, low + 5]  # not the ones handed out
        assert net.free_local_ports(3) == [low + 6, low + 7, low]  # round again
        with pytest.raises(RuntimeError, match="fewer than 8"):
            net.free_local_ports(8)  # one of the 8 is bound


@pytest.mark.parametrize("text", ["5", "10-5", "a-b", "0-10", "1-70000"])
def test_a_malformed_range_is_refused(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setenv(net.PORTS_ENV, text)
    with pytest.raises(ValueError, match=net.PORTS_ENV):
        net.free_local_ports(1)


def test_without_a_range_the_os_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(net.PORTS_ENV, raising=False)
    ports = net.free_local_ports(4)
    assert len(set(ports)) == 4 and all(0 < p < 65536 for p in ports)

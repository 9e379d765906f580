""":func:`kvpool.store.check_master`, which a worker asks before anything slow (vLLM loads
its model first; Mooncake's own setup retries for about 90 s): a listening master is
found, a closed port fails at once with the address in the error, a master in HA mode is
left to etcd (real sockets on 127.0.0.1)."""

from __future__ import annotations

import dataclasses
import socket

import pytest

from kvpool.config import PoolConfig
from kvpool.net import free_local_ports
from kvpool.store import PoolUnavailableError, check_master


def test_a_listening_master_is_found() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        config = dataclasses.replace(PoolConfig(), pool_master=f"127.0.0.1:{port}")
        assert check_master(config) == ("127.0.0.1", port)


def test_a_closed_port_fails_with_its_address() -> None:
    (closed,) = free_local_ports(1)
    config = dataclasses.replace(PoolConfig(), pool_master=f"127.0.0.1:{closed}")
    with pytest.raises(PoolUnavailableError, match=f"nothing answers at 127.0.0.1:{closed}"):
        check_master(config)


def test_masters_in_ha_mode_are_left_to_etcd() -> None:
    (closed,) = free_local_ports(1)
    config = dataclasses.replace(PoolConfig(), pool_master=f"etcd://127.0.0.1:{closed}")
    assert check_master(config) is None

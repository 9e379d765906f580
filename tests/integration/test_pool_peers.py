"""Only the pool's members reach a member's transfer-engine ports (``PoolConfig.pool_peers``,
:mod:`kvpool.confine`), and on loopback only this user's processes reach the pool's
services, against a real mooncake_master and metadata server and real members in processes
of their own, and an intruder that speaks Mooncake's TCP transport itself
(``tests/integration/pool_intruder.py``).

Without a rule (``any``: Mooncake on its own) an intruder that reaches the ports writes the
member's registered memory (with a KV cache moved in place: its live pages) and kills the
member with one malformed handshake; that is what makes these tests able to fail. With a
rule that does not allow it, neither happens, while the members the rule allows still move
data through each other.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvpool.master import MasterConfig
from tests.integration.pool_fixtures import running_master
from tests.integration.pool_intruder import description
from tests.integration.pool_member import Member, member

HOST = "127.0.0.2"
INTRUDER = Path(__file__).with_name("pool_intruder.py")
PAYLOAD = b"kvserve-intruder"
OTHER_UID = os.getuid() + 1
"""An account that is not this one: a rule for it alone refuses this user's processes."""


@pytest.fixture
def master(tmp_path: Path) -> Iterator[MasterConfig]:
    """A master of the test's own: a member killed here stays in its master's segment
    list until the master gives up on it, and puts there meanwhile fail."""
    with running_master(tmp_path, master_host=HOST) as config:
        yield config


def intrude(
    master: MasterConfig,
    target: Member,
    source: str = HOST,
    argv0: tuple[str, ...] = (),
    actions: str = "write,handshake",
) -> dict[str, Any]:
    """Run the intruder (as ``argv0`` + a Python, default this one) against ``target``."""
    python = (*argv0, "/usr/bin/python3") if argv0 else (sys.executable,)
    argv = [*python, str(INTRUDER), source, PAYLOAD.hex(), actions]
    found = json.dumps(description(master.metadata_url, target.hello["segment"]))
    done = subprocess.run(
        argv, input=found, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


def alive(target: Member) -> bool:
    """The member still runs and still moves data."""
    return target.proc.poll() is None and target.roundtrip("peers/alive")


@pytest.mark.timeout(300)
def test_without_a_rule_an_intruder_writes_a_members_memory_and_kills_it(
    master: MasterConfig, tmp_path: Path
) -> None:
    with member(master, HOST, 16, True, tmp_path, "any") as target:
        answer = intrude(master, target, actions="write")
        assert answer["write"] == "applied"
        assert target.peek(answer["address"], len(PAYLOAD)) == PAYLOAD
        intrude(master, target, actions="handshake")
        assert target.proc.wait(timeout=30) != 0, "one malformed handshake ends the member"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("lookup", ["netlink", "proc"])
def test_a_peer_no_rule_allows_neither_writes_nor_kills_a_member(
    master: MasterConfig, tmp_path: Path, lookup: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whichever way the library learns who owns the peer's socket (the kernel's sock_diag,
    or /proc/net/tcp where netlink cannot be used)."""
    monkeypatch.setenv("KVSERVE_CONFINE_LOOKUP", lookup)
    with member(master, HOST, 16, True, tmp_path, f"uid:{OTHER_UID},127.0.0.1") as target:
        answer = intrude(master, target)
        assert answer["write"] == "closed" and answer["handshake"] == "closed"
        assert target.peek(answer["address"], len(PAYLOAD)) != PAYLOAD
        assert alive(target)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("lookup", ["netlink", "proc"])
def test_a_rule_lets_in_its_user_or_its_network_and_members_move_data(
    master: MasterConfig, tmp_path: Path, lookup: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVSERVE_CONFINE_LOOKUP", lookup)
    mine = f"uid:{os.getuid()}"
    with (
        member(master, HOST, 16, True, tmp_path, mine) as holder,
        member(master, HOST, 0, True, tmp_path, mine) as writer,
    ):
        assert writer.roundtrip("peers/a") and writer.roundtrip("peers/b")
        answer = intrude(master, holder, actions="write")
        assert answer["write"] == "applied", "the rule is per account"
    with member(master, HOST, 16, True, tmp_path, f"uid:{OTHER_UID},127.0.0.1/32") as holder:
        assert intrude(master, holder, source="127.0.0.3")["write"] == "closed"
        assert intrude(master, holder, source="127.0.0.1", actions="write")["write"] == "applied"
        assert alive(holder)


@pytest.mark.timeout(300)
@pytest.mark.skipif(os.geteuid() != 0, reason="running as another user needs root")
def test_by_default_another_local_user_is_kept_out(master: MasterConfig, tmp_path: Path) -> None:
    nobody = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")
    with (
        member(master, HOST, 16, True, tmp_path) as holder,
        member(master, HOST, 0, True, tmp_path) as writer,
    ):
        answer = intrude(master, holder, argv0=nobody)
        assert answer["write"] == "closed" and answer["handshake"] == "closed"
        assert holder.peek(answer["address"], len(PAYLOAD)) != PAYLOAD
        assert writer.roundtrip("peers/default") and alive(holder)


PROBE = """
import socket, sys
host, port, request = sys.argv[1], int(sys.argv[2]), sys.argv[3].encode()
with socket.create_connection((host, port), timeout=10) as sock:
    sock.settimeout(5)
    try:
        sock.sendall(request)
        print("answered" if sock.recv(64) else "closed")
    except TimeoutError:
        print("waiting")
    except (ConnectionResetError, BrokenPipeError):  # closed with the request unread
        print("closed")
"""
"""Connects, sends a request and says whether the service answered, closed the connection
at once, or kept it open without a word (it waits for more of a request)."""


def probe(port: int, request: str, argv0: tuple[str, ...] = ()) -> str:
    python = (*argv0, "/usr/bin/python3") if argv0 else (sys.executable,)
    argv = [*python, "-c", PROBE, HOST, str(port), request]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


@pytest.mark.timeout(300)
@pytest.mark.skipif(os.geteuid() != 0, reason="running as another user needs root")
def test_on_loopback_the_pool_services_serve_only_this_user(master: MasterConfig) -> None:
    nobody = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")
    get = f"GET /metadata?key=x HTTP/1.0\r\nHost: {HOST}\r\n\r\n"
    assert probe(master.master_metadata_port, get) == "answered"
    assert probe(master.master_metadata_port, get, nobody) == "closed"
    assert probe(master.master_port, "") == "waiting"  # an RPC client's first bytes
    assert probe(master.master_port, "", nobody) == "closed"
    assert probe(master.master_metrics_port, "GET /metrics HTTP/1.0\r\n\r\n", nobody) == "closed"

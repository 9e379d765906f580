"""Mooncake's listeners stay on the member's own address (:mod:`kvpool.confine`), against a
real mooncake_master and real pool members in processes of their own.

The members use ``127.0.0.2`` (a loopback address that is not the one every tool defaults
to), so "bound to the member's address" and "bound to every interface" look different. A
member with no pool segment writes and reads through another's segment, so the transfer
engine's data path crosses the confined listeners; an unconfined member shows what Mooncake
does on its own (this is what makes the test able to fail).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from kvpool.confine import build
from kvpool.master import MasterConfig
from tests.integration.pool_fixtures import running_master

HOST = "127.0.0.2"
CONFINED = {HOST, f"::ffff:{HOST}"}
WILDCARD = {"0.0.0.0", "::"}


class Member:
    """A running ``tests.integration.pool_member`` process."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.hello = self._answer()

    def _answer(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"the member exited: {self.proc.communicate(timeout=30)[1][-3000:]}"
        answer: dict[str, Any] = json.loads(line)
        return answer

    def roundtrip(self, key: str) -> bool:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"roundtrip {key}\n")
        self.proc.stdin.flush()
        return bool(self._answer()["ok"])


@contextmanager
def member(master: MasterConfig, segment_mib: int, confined: bool, cache: Path) -> Iterator[Member]:
    argv = [sys.executable, "-m", "tests.integration.pool_member", master.rpc_address]
    argv += [master.metadata_url, HOST, str(segment_mib), "1" if confined else "0", str(cache)]
    with subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        try:
            yield Member(proc)
        finally:
            proc.communicate(timeout=60)  # closes stdin: the member leaves and exits


@pytest.fixture(scope="module")
def master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MasterConfig]:
    with running_master(tmp_path_factory.mktemp("confine"), master_host=HOST) as config:
        yield config


@pytest.mark.timeout(300)
def test_confined_listeners_bind_the_members_address_and_carry_data(
    master: MasterConfig, tmp_path: Path
) -> None:
    with (
        member(master, 64, True, tmp_path) as holder,
        member(master, 0, True, tmp_path) as writer,
    ):
        for m in (holder, writer):
            assert m.hello["listening"], "a pool member opens transfer-engine ports"
            assert set(m.hello["listening"]) <= CONFINED, m.hello["listening"]
        assert writer.roundtrip("confined/a") and writer.roundtrip("confined/b")


@pytest.mark.timeout(300)
def test_without_confinement_mooncake_listens_on_every_interface(
    master: MasterConfig, tmp_path: Path
) -> None:
    with member(master, 16, False, tmp_path) as loose:
        assert set(loose.hello["listening"]) & WILDCARD, loose.hello["listening"]


def test_the_library_is_built_once_per_cache(tmp_path: Path) -> None:
    first = build(tmp_path)
    assert first.is_file() and build(tmp_path) == first
    assert first.stat().st_mtime_ns == build(tmp_path).stat().st_mtime_ns

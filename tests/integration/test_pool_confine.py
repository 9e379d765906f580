"""Mooncake's listeners stay on the member's own address (:mod:`kvpool.confine`), against a
real mooncake_master and real pool members in processes of their own.

The members use ``127.0.0.2`` (a loopback address that is not the one every tool defaults
to), so "bound to the member's address" and "bound to every interface" look different. A
member with no pool segment writes and reads through another's segment, so the transfer
engine's data path crosses the confined listeners; an unconfined member shows what Mooncake
does on its own (this is what makes the test able to fail).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kvpool.confine import build
from kvpool.master import MasterConfig
from tests.integration.pool_fixtures import running_master
from tests.integration.pool_member import member

HOST = "127.0.0.2"
CONFINED = {HOST, f"::ffff:{HOST}"}
WILDCARD = {"0.0.0.0", "::"}


@pytest.fixture(scope="module")
def master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MasterConfig]:
    with running_master(tmp_path_factory.mktemp("confine"), master_host=HOST) as config:
        yield config


@pytest.mark.timeout(300)
def test_confined_listeners_bind_the_members_address_and_carry_data(
    master: MasterConfig, tmp_path: Path
) -> None:
    with (
        member(master, HOST, 64, True, tmp_path) as holder,
        member(master, HOST, 0, True, tmp_path) as writer,
    ):
        for m in (holder, writer):
            assert m.hello["listening"], "a pool member opens transfer-engine ports"
            assert set(m.hello["listening"]) <= CONFINED, m.hello["listening"]
        assert writer.roundtrip("confined/a") and writer.roundtrip("confined/b")


@pytest.mark.timeout(300)
def test_without_confinement_mooncake_listens_on_every_interface(
    master: MasterConfig, tmp_path: Path
) -> None:
    with member(master, HOST, 16, False, tmp_path) as loose:
        assert set(loose.hello["listening"]) & WILDCARD, loose.hello["listening"]


def test_the_library_is_built_once_per_cache(tmp_path: Path) -> None:
    first = build(tmp_path)
    assert first.is_file() and build(tmp_path) == first
    assert first.stat().st_mtime_ns == build(tmp_path).stat().st_mtime_ns

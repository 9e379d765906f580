"""When :func:`kvpool.confine.confine` re-executes the process and when it only warns (the
re-executed path itself runs in tests/integration/test_pool_confine.py)."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import NoReturn

import pytest

from kvpool import confine as mod
from kvpool.config import PoolConfig


class ExecCalledError(Exception):
    """Raised instead of replacing the test process."""


@pytest.fixture
def execs(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, str]]:
    seen: list[dict[str, str]] = []

    def fake_execve(_path: str, _argv: list[str], env: dict[str, str]) -> NoReturn:
        seen.append(env)
        raise ExecCalledError

    monkeypatch.setattr(os, "execve", fake_execve)
    monkeypatch.delenv(mod.ADDRESS_VARIABLE, raising=False)
    monkeypatch.delenv(mod.PEERS_VARIABLE, raising=False)
    return seen


def test_ipv4_of_literals_and_names() -> None:
    assert mod.ipv4_of("127.0.0.2") == "127.0.0.2"
    assert mod.ipv4_of("localhost") == "127.0.0.1"
    assert mod.ipv4_of("::1") is None
    assert mod.ipv4_of("no-such-host.invalid") is None


def test_a_process_without_the_library_is_re_executed_with_it(
    execs: list[dict[str, str]], tmp_path: Path
) -> None:
    with pytest.raises(ExecCalledError):
        mod.confine("127.0.0.1", tmp_path)
    (env,) = execs
    assert env[mod.ADDRESS_VARIABLE] == "127.0.0.1"
    assert env[mod.PEERS_VARIABLE] == f"uid:{os.getuid()}"
    assert env["LD_PRELOAD"].split()[0] == str(mod.library_path(tmp_path))


def test_other_peers_re_execute_a_process_confined_for_others(
    execs: list[dict[str, str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(mod.ADDRESS_VARIABLE, "127.0.0.1")
    monkeypatch.setenv(mod.PEERS_VARIABLE, "uid:12345")
    with pytest.raises(ExecCalledError):
        mod.confine("127.0.0.1", tmp_path, "10.1.2.0/24, uid:7")
    assert execs[0][mod.PEERS_VARIABLE] == "10.1.2.0/24,uid:7"


@pytest.mark.parametrize(
    ("setting", "host", "rules"),
    [
        ("auto", "127.0.0.1", f"uid:{os.getuid()}"),
        ("auto", "127.0.0.2", f"uid:{os.getuid()}"),
        ("auto", "localhost", f"uid:{os.getuid()}"),
        ("auto", "198.51.100.7", ""),
        ("any", "127.0.0.1", ""),
        ("uid:0,uid:1000", "198.51.100.7", "uid:0,uid:1000"),
        (" 10.0.0.9 , 10.1.2.3/16,uid:5", "127.0.0.1", "10.0.0.9/32,10.1.0.0/16,uid:5"),
    ],
)
def test_peer_rules_for_the_library(setting: str, host: str, rules: str) -> None:
    assert mod.peer_rules(setting, host) == rules


@pytest.mark.parametrize(
    "setting", ["", "uid:", "uid:-1", "uid:4294967295", "uid:x", "10.0.0.0/33", "::1", "me"]
)
def test_a_peer_setting_that_is_not_a_rule_is_refused(setting: str) -> None:
    with pytest.raises(ValueError, match="pool_peers"):
        mod.parse_peers(setting)
    with pytest.raises(ValueError, match="pool_peers"):
        PoolConfig(pool_peers=setting)


@pytest.mark.parametrize(
    ("host", "setup", "warning"),
    [
        ("::1", None, "is not an IPv4 address"),
        ("127.0.0.1", "no-compiler", "no C compiler"),
        ("127.0.0.1", "re-executed", "LD_PRELOAD did not load"),
    ],
)
def test_where_it_cannot_confine_it_warns_and_goes_on(
    host: str,
    setup: str | None,
    warning: str,
    execs: list[dict[str, str]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    if setup == "no-compiler":
        monkeypatch.setattr(shutil, "which", lambda _name: None)
    if setup == "re-executed":  # the variables say we were re-executed; the map says no
        monkeypatch.setenv(mod.ADDRESS_VARIABLE, host)
        monkeypatch.setenv(mod.PEERS_VARIABLE, mod.peer_rules("auto", host))
    with caplog.at_level(logging.WARNING, logger=mod.__name__):
        mod.confine(host, tmp_path)
    assert execs == [] and warning in caplog.text and "every interface" in caplog.text

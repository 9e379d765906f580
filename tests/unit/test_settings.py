"""Settings as flags and variables (:mod:`kvserve.settings`): each flag's help comes from its
field's docstring entry, and a variable that does not parse names itself."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest

from kvpool.config import PoolConfig
from kvpool.master import MasterConfig
from kvserve.settings import SettingError, add_config_args, field_docs
from proto.registry import ClusterConfig
from workers.config import EngineConfig, WorkerConfig


@dataclasses.dataclass(frozen=True)
class Toy:
    """A toy.

    - ``size``: how big, in
      units.
    - ``low`` / ``high``: the bounds.
    - ``flag``: on or off.

    Not a bullet: ``size`` again.
    """

    size: int = 1
    low: float = 0.0
    high: float = 1.0
    flag: bool = False


def test_field_docs_read_the_bullets_continued_and_shared() -> None:
    assert field_docs(Toy) == {
        "size": "how big, in units.",
        "low": "the bounds.",
        "high": "the bounds.",
        "flag": "on or off.",
    }


@pytest.mark.parametrize(
    "cls", [EngineConfig, WorkerConfig, PoolConfig, ClusterConfig, MasterConfig]
)
def test_every_field_of_the_service_settings_is_described(cls: type) -> None:
    assert set(field_docs(cls)) >= {f.name for f in dataclasses.fields(cls)}


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("KVSERVE_SIZE", "1g", "KVSERVE_SIZE='1g' is not an integer"),
        ("KVSERVE_LOW", "x", "KVSERVE_LOW='x' is not a number"),
        ("KVSERVE_FLAG", "maybe", "KVSERVE_FLAG='maybe' is not a boolean"),
    ],
)
def test_a_malformed_variable_names_itself(
    variable: str, value: str, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import argparse

    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingError) as raised:
        add_config_args(argparse.ArgumentParser(), Toy)
    assert str(raised.value) == message


def test_the_command_says_so_in_one_line() -> None:
    env = {**os.environ, "KVSERVE_KV_CACHE_MIB": "1g"}
    done = subprocess.run(
        [sys.executable, "-m", "kvserve", "up"], env=env, capture_output=True, text=True
    )
    assert done.returncode == 2
    assert done.stderr == "kvserve: error: KVSERVE_KV_CACHE_MIB='1g' is not an integer\n"

"""The core runs without the optional extras (:mod:`kvserve.extras`), and a command that
needs one names it.

The check is real imports in a fresh interpreter in which the extras' modules (and the
pool's ``mooncake``) cannot be imported: every module of ``kvpool``, ``proto``,
``workers``, ``router`` and of the parts of ``kvserve`` that serve (the cluster launcher,
the verbs) must import, and ``kvserve bench`` must stop with the one-line message.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from kvserve.extras import EXTRAS, install_hint, missing_extra

CORE = ("kvpool", "proto", "workers", "router", "kvserve.cluster", "kvserve.verbs")
"""Packages a worker, the router and ``kvserve up`` run from."""
BLOCKED = (*EXTRAS, "mooncake")

PROGRAM = textwrap.dedent(
    """
    import importlib, importlib.abc, pkgutil, sys

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.partition(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, Block())
    for package in CORE:
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, package + "."):
            importlib.import_module(info.name)
    from kvserve.cli import main
    sys.exit(main(["bench", "trace", "--help"]))
    """
)


def test_the_core_imports_without_the_extras_and_bench_names_its_extra() -> None:
    program = f"BLOCKED = {BLOCKED!r}\nCORE = {CORE!r}\n{PROGRAM}"
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "kvserve: error: this command needs aiohttp, from kvserve's bench extra: "
        + install_hint("bench")
    )


@pytest.mark.parametrize("name", ["matplotlib.pyplot", "aiohttp", "rich.table"])
def test_a_missing_extra_module_names_its_extra(name: str) -> None:
    message = missing_extra(ModuleNotFoundError(name=name))
    top = name.partition(".")[0]
    assert message == f"this command needs {top}, from kvserve's bench extra: " + install_hint(
        "bench"
    )


@pytest.mark.parametrize("name", ["numpy", None, "aiohttpx"])
def test_a_missing_core_module_is_no_extra(name: str | None) -> None:
    assert missing_extra(ModuleNotFoundError(name=name)) is None


def test_the_pool_hint_names_both_builds() -> None:
    assert install_hint("pool-cpu") == (
        "pip install 'kvserve[pool-cpu]' or 'kvserve[pool-cuda]' on a GPU machine "
        "(scripts/setup.sh installs every extra)"
    )

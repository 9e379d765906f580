"""The native kernels' build lock: a build killed mid-way stalls no later worker.

cpp_extension serializes builds with a baton file (``lock``) that a killed build leaves
behind; every later build then waited for it (up to 15 minutes, seen in CI when a test
worker was killed while compiling). :func:`workers.model.native._build_lock` holds an
``flock`` around the build, which the kernel drops when its holder dies, so the next
builder knows the baton is stale and removes it at once.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from workers.model import native
from workers.model.native import _build_lock

HOLD = """
import fcntl, sys, time
handle = open(sys.argv[1], "a")
fcntl.flock(handle, fcntl.LOCK_EX)
open(sys.argv[2], "w").close()  # cpp_extension's baton, as a build in progress makes it
print("held", flush=True)
time.sleep(600)
"""


def test_a_baton_left_by_a_killed_build_is_removed_by_the_next_build(tmp_path: Path) -> None:
    baton = tmp_path / "lock"
    builder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path / "build.flock"), str(baton)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert builder.stdout is not None and builder.stdout.readline().strip() == "held"
        assert baton.exists()
    finally:
        builder.kill()  # killed mid-build: its baton stays, its flock goes with it
        builder.wait()
    assert baton.exists()
    with _build_lock(tmp_path):
        assert not baton.exists()


def test_the_build_lock_can_be_taken_again_after_it_is_left(tmp_path: Path) -> None:
    for _ in range(2):
        with _build_lock(tmp_path):
            (tmp_path / "lock").touch()  # a baton of a live build, left on a crash below
    with _build_lock(tmp_path):
        assert not (tmp_path / "lock").exists()


def test_a_built_kernel_is_loaded_as_it_is(tmp_path: Path) -> None:
    """A binary built for the key loads without cpp_extension (which would rebuild it for a
    checkout at another path); a broken one (a build killed while linking) is refused, so
    it is built again."""
    native.build()
    key = native.cache_key()
    name = f"kvserve_paged_attention_{key}.so"
    shutil.copy(native.build_dir(key) / name, tmp_path / name)
    loaded = native._load_built(key, tmp_path)
    assert loaded is not None and callable(loaded.paged_attention)
    assert not (tmp_path / "build.ninja").exists()  # loaded, not built
    broken = tmp_path / "broken"  # elsewhere: the loaded one stays mapped and cached
    broken.mkdir()
    (broken / name).write_bytes(b"\x7fELF truncated")
    assert native._load_built(key, broken) is None
    assert native._load_built(key, tmp_path / "nothing-here") is None

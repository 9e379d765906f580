"""The suite's files, longest first, so that a pass ends soon after its total work allows.

scripts/test.sh hands whole files to its xdist processes (``--dist loadfile``, with
:class:`FilesAndGroups`, so that a module's cluster starts once) in collection order, with
xdist's own reordering (by number of tests) off. A pass ends when its last file does; a
four-minute file handed out last (xdist's order put the vLLM cluster's file late) would set
the pass's time alone. Handing out the longest files first (longest-processing-time-first)
lets the short ones fill in around them.

Durations come from :data:`DURATIONS` (seconds per file: setup, call and teardown of every
test in it, as measured on 2 cores under the suite's own load); a file it does not list
counts as the median of those it does. ``pytest --store-file-durations`` (give it to
scripts/test.sh as ``PYTEST_ADDOPTS``) measures the files the run ran and merges them into
it; both passes may write at once (a lock keeps their updates apart). An out-of-date file
only makes the order less good; every test runs either way.
"""

from __future__ import annotations

import fcntl
import json
import os
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol, TypeVar

import pytest
from xdist.scheduler import LoadFileScheduling

DURATIONS = Path(__file__).with_name("durations.json")
STORE = "--store-file-durations"


class HasNodeId(Protocol):
    @property
    def nodeid(self) -> str: ...


T = TypeVar("T", bound=HasNodeId)


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def longest_first(items: Sequence[T], seconds: Mapping[str, float]) -> list[T]:
    """``items`` with their files longest first (an unlisted file weighs the median of the
    listed ones, 0 when none is), keeping the order of the items within a file and of files
    of equal weight."""
    default = statistics.median(seconds.values()) if seconds else 0.0
    position: dict[str, int] = {}
    for item in items:
        position.setdefault(file_of(item.nodeid), len(position))

    def key(item: T) -> tuple[float, int]:
        name = file_of(item.nodeid)
        return -seconds.get(name, default), position[name]

    return sorted(items, key=key)


def read_durations(path: Path = DURATIONS) -> dict[str, float]:
    """The stored seconds per file (none when the file is missing)."""
    if not path.exists():
        return {}
    stored = json.loads(path.read_text())
    return {str(k): float(v) for k, v in stored.items()}


def merge_durations(measured: Mapping[str, float], path: Path = DURATIONS) -> None:
    """Replace the stored seconds of the files in ``measured``, keep the others (under an
    exclusive lock: both passes of scripts/test.sh may finish at once)."""
    folder = os.open(path.parent, os.O_RDONLY)  # the lock: the folder, no stray file
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)
        stored = read_durations(path) | {k: round(v, 1) for k, v in measured.items()}
        path.write_text(json.dumps(dict(sorted(stored.items())), indent=1) + "\n")
    finally:
        os.close(folder)  # (closing releases the lock)


class FileDurations:
    """The plugin: orders the collection, and with :data:`STORE` sums each file's report
    durations (on the process that reports, xdist's controller when there is one) and
    merges them at the session's end."""

    def __init__(self, store: bool) -> None:
        self.store = store
        self.measured: defaultdict[str, float] = defaultdict(float)

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        items[:] = longest_first(items, read_durations())

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if self.store:
            self.measured[file_of(report.nodeid)] += report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.store and self.measured and not hasattr(session.config, "workerinput"):
            merge_durations(self.measured)


EVAL_CLUSTER = "eval_cluster"
"""The package-scoped cluster of tests/e2e (its fixture's name)."""
ONE_PROCESS = {
    EVAL_CLUSTER: frozenset(
        f"tests/e2e/{name}.py"
        for name in (
            "test_lm_eval",
            "test_openai_eval_api",
            "test_status_page",
            "test_redis_roles_live",
            "test_router_token_replay",
        )
    )
}
"""Files that scripts/test.sh runs on one process, by the package-scoped fixture their tests
share (it then starts once, not once per process). tests/e2e/conftest.py refuses a test
that takes the fixture from a file not listed here."""


class FilesAndGroups(LoadFileScheduling):  # type: ignore[misc]  # xdist is untyped
    """xdist's scheduler for ``--dist loadfile`` here: whole files to a process, except that
    the files of one :data:`ONE_PROCESS` entry go to one process together."""

    def _split_scope(self, nodeid: str) -> str:
        name = file_of(nodeid)
        return next((group for group, files in ONE_PROCESS.items() if name in files), name)

"""The suite's file order (:mod:`tests.file_order`): longest files first, stable otherwise,
and the stored durations merged, not overwritten."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tests.file_order import longest_first, merge_durations, read_durations


@dataclass(frozen=True)
class Item:
    nodeid: str


def ids(items: list[Item]) -> list[str]:
    return [i.nodeid for i in items]


def test_longest_files_first_keeping_each_files_order() -> None:
    items = [Item("a.py::x"), Item("a.py::y"), Item("b.py::x"), Item("c.py::x[1]"),
             Item("c.py::x[2]"), Item("d.py::z")]  # fmt: skip
    seconds = {"a.py": 1.0, "b.py": 30.0, "c.py": 5.0}  # d.py: the median, 5.0
    assert ids(longest_first(items, seconds)) == [
        "b.py::x", "c.py::x[1]", "c.py::x[2]", "d.py::z", "a.py::x", "a.py::y"
    ]  # fmt: skip


def test_without_durations_the_order_is_kept() -> None:
    items = [Item("b.py::x"), Item("a.py::x"), Item("b.py::y")]
    assert ids(longest_first(items, {})) == ["b.py::x", "b.py::y", "a.py::x"]


def test_a_merge_replaces_what_it_measured_and_keeps_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "durations.json"
    assert read_durations(path) == {}
    merge_durations({"b.py": 2.04, "a.py": 1.0}, path)
    merge_durations({"b.py": 7.0, "c.py": 3.0}, path)
    assert read_durations(path) == {"a.py": 1.0, "b.py": 7.0, "c.py": 3.0}
    assert list(json.loads(path.read_text())) == ["a.py", "b.py", "c.py"]

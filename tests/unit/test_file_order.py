"""The suite's file order (:mod:`tests.file_order`): longest files first, stable otherwise,
the stored durations merged, not overwritten, and the units xdist hands out."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tests.file_order import FilesAndGroups, longest_first, merge_durations, read_durations


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


def test_a_file_is_one_unit_unless_it_shares_a_process() -> None:
    split = FilesAndGroups.__new__(FilesAndGroups)._split_scope  # (pure: no state used)
    assert split("tests/a.py::test_x") == "tests/a.py"
    assert split("tests/a.py::Case::test_x[1-2]") == "tests/a.py"
    assert split("tests/e2e/test_lm_eval.py::test_x") == "eval_cluster"
    assert split("tests/e2e/test_status_page.py::test_y[a]") == "eval_cluster"
    assert split("tests/e2e/test_dashboard.py::test_z") == "tests/e2e/test_dashboard.py"

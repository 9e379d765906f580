"""No module of the project is over :data:`MAX_LINES` lines (issue 39, item 6): a file that
grows past it is split by responsibility, each new file's opening docstring saying what it
owns. Generated protobuf modules are not counted."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("router", "workers", "kvpool", "proto", "kvserve", "vllm_backend")
MAX_LINES = 330


def too_long(root: Path, limit: int = MAX_LINES) -> list[str]:
    """``path: lines`` of every ``.py`` file under ``root``'s packages over ``limit``."""
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            if "_pb2" in path.name:
                continue
            lines = len(path.read_text().splitlines())
            if lines > limit:
                found.append(f"{path.relative_to(root)}: {lines}")
    return found


def test_no_module_is_over_the_limit() -> None:
    assert too_long(ROOT) == []


def test_the_check_sees_a_long_file(tmp_path: Path) -> None:
    (tmp_path / "router").mkdir()
    (tmp_path / "router" / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (tmp_path / "router" / "ok.py").write_text("x = 1\n" * MAX_LINES)
    (tmp_path / "proto").mkdir()
    (tmp_path / "proto" / "big_pb2.py").write_text("x = 1\n" * 1000)
    assert too_long(tmp_path) == [f"router/long.py: {MAX_LINES + 1}"]

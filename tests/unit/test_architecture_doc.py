"""docs/architecture.md's components table names every module of the product: each ``.py``
file (not ``__init__.py`` or generated code) appears in the row of the deepest folder that
has one (``| `router/flow/` | ...``), in backticks: by its path within that folder, or by its
name when it lies directly in it or in a sub-folder the row names (`` `routes/` ``)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
PACKAGES = ("kvpool", "proto", "workers", "router", "vllm_backend", "kvserve")
ROW = re.compile(r"^\| `([a-z_/]+/)` \|(.*)$")


def rows(text: str) -> dict[str, str]:
    """Folder (``router/flow/``) -> the rest of its table row."""
    return {m.group(1): m.group(2) for line in text.splitlines() if (m := ROW.match(line))}


def unnamed(text: str, root: Path = ROOT) -> list[str]:
    """Each module whose name its folder's row does not mention."""
    table = rows(text)
    missing = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            if path.name == "__init__.py" or "_pb2" in path.name:
                continue
            folders = [f for f in table if relative.startswith(f)]
            if not folders:
                missing.append(f"{relative} (no row for its folder)")
                continue
            folder = max(folders, key=len)
            if not _names(table[folder], relative.removeprefix(folder)):
                missing.append(relative)
    return missing


def _names(row: str, within: str) -> bool:
    """Whether ``row`` names ``within`` (a path within its folder, ``routes/page.py``)."""
    if f"`{within}`" in row:
        return True
    folder, _, name = within.rpartition("/")
    return f"`{name}`" in row and (not folder or f"`{folder}/`" in row)


def test_every_module_is_named_in_its_folders_row() -> None:
    missing = unnamed(DOC.read_text())
    assert not missing, missing


def test_the_check_sees_a_module_left_out(tmp_path: Path) -> None:
    for relative in ("router/flow/run.py", "router/flow/new.py", "router/main.py"):
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text("")
    doc = "| `router/` | the process (`main.py`) |\n| `router/flow/` | the flow (`run.py`) |\n"
    assert unnamed(doc, tmp_path) == ["router/flow/new.py"]
    (tmp_path / "router/flow/sub").mkdir()
    (tmp_path / "router/flow/sub/deep.py").write_text("")
    doc += "| `router/flow/` | the flow (`run.py`, `new.py`, `other/deep.py`) |\n"
    assert unnamed(doc, tmp_path) == ["router/flow/sub/deep.py"]  # not by another's path

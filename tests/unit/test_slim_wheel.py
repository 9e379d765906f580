"""``scripts/slim_wheel.py``: members matching a pattern leave the wheel and its RECORD;
every other member keeps its bytes."""

from __future__ import annotations

import importlib.util
import types
import zipfile
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "slim_wheel.py"


def _slim_module() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("slim_wheel", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_matching_members_leave_the_wheel_and_its_record(tmp_path: Path) -> None:
    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    members = {
        "pkg/__init__.py": b"x = 1\n",
        "pkg/libbig_pg.so": b"\0" * 1000,
        "pkg/tool_bench": b"bench",
        "pkg/store.so": b"store",
    }
    record = "".join(f"{name},sha256=abc,{len(data)}\n" for name, data in members.items())
    record += "pkg-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(wheel, "w") as out:
        for name, data in members.items():
            out.writestr(name, data)
        out.writestr("pkg-1.0.dist-info/RECORD", record)
    dropped = _slim_module().slim(wheel, ["pkg/libbig_*", "pkg/*_bench"])
    assert sorted(dropped) == ["pkg/libbig_pg.so", "pkg/tool_bench"]
    with zipfile.ZipFile(wheel) as slimmed:
        names = set(slimmed.namelist())
        assert names == {"pkg/__init__.py", "pkg/store.so", "pkg-1.0.dist-info/RECORD"}
        assert slimmed.read("pkg/store.so") == b"store"
        lines = slimmed.read("pkg-1.0.dist-info/RECORD").decode().splitlines()
    assert [line.split(",")[0] for line in lines] == [
        "pkg/__init__.py", "pkg/store.so", "pkg-1.0.dist-info/RECORD",
    ]  # fmt: skip
    assert not wheel.with_name(wheel.name + ".partial").exists()

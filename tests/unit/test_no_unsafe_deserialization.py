"""No code-executing deserialization anywhere in the project's packages.

Bytes from the network (gRPC, Redis, HTTP, the KV pool) and from files (checkpoints,
traces, step logs) are parsed as protobuf, JSON, safetensors or raw spans only. pickle and
its relatives run code chosen by whoever wrote the bytes, so none of them may appear:
this scan fails the build when a change adds one.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("kvpool", "workers", "router", "proto", "kvserve")
_PICKLES = r"(c?[Pp]ickle|dill|cloudpickle|jsonpickle|shelve|joblib)"
UNSAFE = {
    "pickle": re.compile(rf"\b(import|from)\s+{_PICKLES}\b|\b{_PICKLES}\.\w+\s*\("),
    "marshal": re.compile(r"\b(import|from)\s+marshal\b|\bmarshal\.\w+\s*\("),
    "eval/exec": re.compile(r"(?<![.\w])(eval|exec)\s*\("),
    "yaml.load": re.compile(r"\byaml\.(unsafe_)?load(_all)?\s*\((?![^)]*Loader\s*=\s*yaml\.Safe)"),
    "torch.load": re.compile(r"\btorch\.load\s*\((?![^)]*weights_only\s*=\s*True)"),
    "numpy allow_pickle": re.compile(r"allow_pickle\s*=\s*True"),
}


def _sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py") if "_pb2" not in p.name)


def _code(text: str) -> str:
    """The source without comment lines (prose may say 'no pickle')."""
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


def test_the_scan_sees_the_packages() -> None:
    assert len(_sources()) > 50


@pytest.mark.parametrize("name", sorted(UNSAFE))
def test_no_unsafe_deserialization(name: str) -> None:
    pattern = UNSAFE[name]
    hits = [
        f"{path.relative_to(ROOT)}: {m.group(0)!r}"
        for path in _sources()
        for m in pattern.finditer(_code(path.read_text()))
    ]
    assert not hits, f"{name} deserializes by running code; use JSON/protobuf: {hits}"


@pytest.mark.parametrize(
    ("name", "line"),
    [
        ("pickle", "import pickle"),
        ("pickle", "data = pickle.loads(raw)"),
        ("marshal", "marshal.loads(b)"),
        ("eval/exec", "x = eval(text)"),
        ("yaml.load", "yaml.load(f)"),
        ("torch.load", "torch.load(path, map_location='cpu')"),
        ("numpy allow_pickle", "np.load(p, allow_pickle=True)"),
    ],
)
def test_the_patterns_catch_what_they_mean(name: str, line: str) -> None:
    assert UNSAFE[name].search(line)


@pytest.mark.parametrize(
    "line", ["model.eval()", "torch.load(p, weights_only=True)", "yaml.safe_load(f)"]
)
def test_safe_calls_pass(line: str) -> None:
    assert not any(p.search(line) for p in UNSAFE.values())

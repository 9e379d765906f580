"""Each setting's default is written once (issue 39, item 3): no two settings dataclasses of
the product and its tools declare the same literal default for a field of the same name.
Where a setting appears in several configs (``kvserve up``'s flags and the cluster spec,
the router's config and the simulator's deployment, an engine's config and its
scheduler's), all but its owner take the owner's value (``router_port: int =
RouterConfig.router_port``), which this AST walk does not count as a literal.

Scope: the classes named ``*Config``, ``*Spec`` or ``*Settings`` decorated ``@dataclass``
under :data:`ROOTS` (``kvserve/bench`` only its ``trace`` package, whose configs mirror the
pool's and the simulator's); ``ClassVar`` attributes are not fields. :data:`UNRELATED`
names the field names that mean a different thing in each tool that has one."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROOTS = (
    "router",
    "workers",
    "kvpool",
    "proto",
    "vllm_backend",
    "kvserve/cluster",
    "kvserve/sim",
    "kvserve/chaos",
    "kvserve/loadgen",
    "kvserve/bench",
)
UNRELATED = {
    "seed": "each tool's own random seed",
    "out": "where each tool writes its report",
    "timeout_s": "a probe's answer against a load run's request",
    "model": "a weights directory against a served model's name or a cost model",
}
"""Field names that several configs share for settings that are not the same one."""
CONFIG = re.compile(r"(Config|Spec|Settings)$")


def _is_dataclass(node: ast.ClassDef) -> bool:
    for d in node.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        if isinstance(target, ast.Name) and target.id == "dataclass":
            return True
    return False


def _literal_default(statement: ast.AnnAssign) -> str | None:
    """The default of a field as source text if it is a literal (a constant, a negated one,
    or ``field(default=<literal>)``), else None."""
    if "ClassVar" in ast.unparse(statement.annotation) or statement.value is None:
        return None
    value: ast.expr | None = statement.value
    if isinstance(value, ast.Call) and ast.unparse(value.func) == "field":
        value = next((k.value for k in value.keywords if k.arg == "default"), None)
    if isinstance(value, ast.UnaryOp):
        value = value.operand
    return ast.unparse(statement.value) if isinstance(value, ast.Constant) else None


def literal_defaults(source: str, where: str) -> dict[str, list[tuple[str, str]]]:
    """Field name -> [(``where:Class``, default)] for every literal default of a config
    class in ``source``."""
    found: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and CONFIG.search(node.name) and _is_dataclass(node):
            for statement in node.body:
                if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
                    default = _literal_default(statement)
                    if default is not None:
                        found[statement.target.id].append((f"{where}:{node.name}", default))
    return found


def restated(found: dict[str, list[tuple[str, str]]]) -> list[str]:
    """Each field name whose same literal default two configs declare, with the configs."""
    out = []
    for name, uses in sorted(found.items()):
        by_value: dict[str, list[str]] = defaultdict(list)
        for where, default in uses:
            by_value[default].append(where)
        out += [f"{name} = {v}: {', '.join(w)}" for v, w in by_value.items() if len(w) > 1]
    return out


def _files() -> list[Path]:
    files = []
    for root in ROOTS:
        for path in sorted((ROOT / root).rglob("*.py")):
            if root == "kvserve/bench" and path.parent.name != "trace":
                continue
            files.append(path)
    return files


def test_no_two_configs_declare_the_same_default() -> None:
    found: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for path in _files():
        for name, uses in literal_defaults(path.read_text(), str(path.relative_to(ROOT))).items():
            if name not in UNRELATED:
                found[name] += uses
    assert restated(found) == []


def test_the_check_sees_a_restated_default_and_not_a_borrowed_one() -> None:
    source = """
from dataclasses import dataclass, field
from typing import ClassVar
@dataclass
class OwnerConfig:
    port: int = 8000
    name: str = field(default="a", repr=False)
    neg: int = -1
    prefix: ClassVar[str] = "X_"
@dataclass(frozen=True)
class CopySpec:
    port: int = 8000
    name: str = OwnerConfig.name
    neg: int = -1
    prefix: ClassVar[str] = "X_"
@dataclass
class OtherSettings:
    port: int = 9000
class NotAConfig:
    port: int = 8000
"""
    assert restated(literal_defaults(source, "m")) == [
        "neg = -1: m:OwnerConfig, m:CopySpec",
        "port = 8000: m:OwnerConfig, m:CopySpec",
    ]

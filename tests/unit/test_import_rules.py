"""The import rules of docs/architecture.md, enforced over every module (an AST walk, so a
lazy import inside a function counts the same as one at the top).

- ``kvpool`` imports no project package; ``proto`` only ``kvpool.keyring``;
- ``workers`` and ``router`` import ``proto`` and ``kvpool``, never each other or ``kvserve``;
- ``vllm_backend`` imports ``workers``, ``proto`` and ``kvpool``; only its modules import
  vLLM (and vLLM's ZeroMQ and msgspec), and only those of :data:`IN_VLLM`, which run inside
  vLLM's environment (no other module imports them);
- nothing outside ``kvserve`` imports ``kvserve``;
- within ``kvserve``, the simulator and the load generator import no benchmark
  (``kvserve.bench``): what they share lives with them, apart from the live run
  ``sim validate`` checks the simulator against (:data:`BENCH_ALLOWED`);
- the pure bookkeeping modules import nothing that computes on tensors or does I/O;
- ``router``, ``workers`` and ``proto`` take the tokenizer from :mod:`proto.tokenization`
  only (the one wrapper both sides share): no other module imports ``tokenizers`` or a
  transformers tokenizer class, apart from the GGUF conversion (:data:`TOKENIZER_HOMES`);
- no import circles among the project's modules (:data:`CIRCLE_FREE`): the module-level
  import graph has no strongly connected component of more than one module.
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("kvpool", "proto", "workers", "router", "vllm_backend", "kvserve")
ALLOWED: dict[str, tuple[str, ...]] = {
    "kvpool": ("kvpool",),
    "proto": ("proto", "kvpool.keyring"),
    "workers": ("workers", "proto", "kvpool"),
    "router": ("router", "proto", "kvpool"),
    "vllm_backend": ("vllm_backend", "workers", "proto", "kvpool"),
    "kvserve": PACKAGES,
}
"""Package -> the project modules (and their submodules) it may import."""
PURE = (
    "workers/core/scheduler.py",
    "workers/core/block_manager.py",
    "workers/core/block_pool.py",
    "router/placement/policies.py",
    "router/placement/policy.py",
    "router/placement/cache_aware.py",
    "router/placement/types.py",
    "router/placement/admission.py",
    "router/placement/pending.py",
    "router/placement/prefix_index.py",
    "router/placement/expected_blocks.py",
    "router/placement/kv_wait.py",
    "router/control/ratio.py",
    "router/control/ratio_config.py",
    "router/observability/latency_window.py",
    "vllm_backend/plans.py",
    "vllm_backend/cache_names.py",
    "vllm_backend/reservations.py",
)
IMPURE = ("torch", "numpy", "grpc", "redis", "socket", "subprocess", "urllib", "mooncake")
VLLM_LIBRARIES = ("vllm", "zmq", "msgspec")
IN_VLLM = (
    "vllm_backend/connector.py",
    "vllm_backend/conn_scheduler.py",
    "vllm_backend/conn_worker.py",
    "vllm_backend/reports.py",
    "vllm_backend/inbox.py",
    "vllm_backend/engine.py",
    "vllm_backend/event_feed.py",
    "vllm_backend/servicer.py",
    "vllm_backend/server.py",
)
"""The modules that run inside vLLM's environment: those that import its libraries and
those that import them (the rest of ``vllm_backend`` is tested in the project's own)."""
NO_BENCH = ("kvserve/sim", "kvserve/loadgen")
"""Folders whose modules may not import ``kvserve.bench``."""
BENCH = "kvserve.bench"
BENCH_ALLOWED = {("kvserve/sim/validate.py", "kvserve.bench.compare", "run_deployment")}
"""``(file, module, name)``: the one benchmark piece the simulator takes, the live run that
``sim validate`` compares the simulation with."""

ONE_TOKENIZER = ("router", "workers", "proto", "vllm_backend")
"""Packages whose modules load and run the tokenizer only through ``proto.tokenization``."""
TOKENIZER_HOMES = ("proto/tokenization.py", "workers/model/prepare.py")
"""The shared wrapper, and the conversion that reads the GGUF's vocabulary to write the
``tokenizer.json`` the wrapper loads."""
CIRCLE_FREE = PACKAGES
"""Packages whose modules form no import circle, among themselves or with each other.

An edge is every import the AST walk sees: at the top, inside a function, and under
``if TYPE_CHECKING:`` too (a typing-only import still couples the two modules; the lower
module owns a Protocol instead). ``from pkg import name`` is an edge to ``pkg.name`` where
that is a module, to ``pkg`` (its ``__init__``) otherwise. Importing ``a.b.c`` is an edge to
``a.b.c`` only: the parents' ``__init__`` modules run first, but a package that re-exports
its own submodules is no circle."""


def imports(path: Path, root: Path = ROOT) -> set[str]:
    """Every module ``path`` (under ``root``) imports, absolute (relative imports resolved)."""
    return {module for module, _ in imported_names(path, root)}


def imported_names(path: Path, root: Path = ROOT) -> set[tuple[str, str | None]]:
    """``(module, name)`` for each ``from module import name`` in ``path`` (relative imports
    resolved) and ``(module, None)`` for each ``import module``."""
    package = ".".join(path.relative_to(root).with_suffix("").parts[:-1])
    found: set[tuple[str, str | None]] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {(alias.name, None) for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            found |= {(base, alias.name) for alias in node.names}
    return found


def bench_imports(path: Path, root: Path = ROOT) -> set[str]:
    """What ``path`` takes from ``kvserve.bench`` beyond :data:`BENCH_ALLOWED`, as text."""
    relative = path.relative_to(root).as_posix()
    return {
        f"{relative} imports {target}"
        for module, name in imported_names(path, root)
        if (relative, module, name) not in BENCH_ALLOWED
        for target in [module if name is None else f"{module}.{name}"]
        if within(target, (BENCH,))
    }


def tokenizer_imports(path: Path, root: Path = ROOT) -> set[str]:
    """What ``path`` imports of ``tokenizers`` and transformers' tokenizer classes, as text."""
    relative = path.relative_to(root).as_posix()
    return {
        f"{relative} imports {module if name is None else f'{module}.{name}'}"
        for module, name in imported_names(path, root)
        if within(module, ("tokenizers",))
        or (within(module, ("transformers",)) and "Tokenizer" in (name or module))
    }


def project(module: str) -> bool:
    return module.split(".")[0] in PACKAGES


def within(module: str, allowed: tuple[str, ...]) -> bool:
    return any(module == a or module.startswith(a + ".") for a in allowed)


def sources(package: str, root: Path = ROOT) -> list[Path]:
    return sorted(p for p in (root / package).rglob("*.py") if "_pb2" not in p.name)


def module_name(path: Path, root: Path = ROOT) -> str:
    """``workers/core/sequence.py`` -> ``workers.core.sequence``; a package's
    ``__init__.py`` -> its name."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(packages: tuple[str, ...], root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the modules of ``packages`` it imports (edges as :data:`CIRCLE_FREE` says)."""
    paths = {module_name(p, root): p for package in packages for p in sources(package, root)}
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        targets = set()
        for imported, name in imported_names(path, root):
            submodule = f"{imported}.{name}" if name else imported
            target = submodule if submodule in paths else imported
            if target in paths and target != module:
                targets.add(target)
        graph[module] = targets
    return graph


def strongly_connected(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of ``graph`` (iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            step = next((t for t in edges if t not in index or t in on_stack), None)
            if step is not None and step not in index:
                index[step] = low[step] = len(index)
                stack.append(step)
                on_stack.add(step)
                work.append((step, iter(sorted(graph.get(step, ())))))
                continue
            if step is not None:
                low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                found.append(sorted(component))
    return sorted(found)


def circles(graph: Mapping[str, set[str]]) -> list[str]:
    """Each component of more than one module, as its shortest circle through each member
    (``a -> b -> a``), so that every import to break is named."""
    lines: list[str] = []
    for component in strongly_connected(graph):
        if len(component) < 2:
            continue
        members = set(component)
        paths = {shortest_circle(graph, start, members) for start in component}
        lines += sorted(" -> ".join(path) for path in paths)
    return lines


def shortest_circle(
    graph: Mapping[str, set[str]], start: str, members: set[str]
) -> tuple[str, ...]:
    """The shortest path ``start -> ... -> start`` within ``members``, rotated to begin at
    its smallest module (so one circle reads the same from each of its members)."""
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for target in sorted(graph[node] & members):
            if target == start:
                path = [node]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                ring = path[::-1]
                first = ring.index(min(ring))
                ring = ring[first:] + ring[:first]
                return (*ring, ring[0])
            if target not in came_from:
                came_from[target] = node
                queue.append(target)
    raise ValueError(f"{start} is on no circle")


@pytest.mark.parametrize("package", PACKAGES)
def test_each_package_imports_only_what_its_rule_allows(package: str) -> None:
    broken = {
        f"{path.relative_to(ROOT)} imports {module}"
        for path in sources(package)
        for module in imports(path)
        if project(module) and not within(module, ALLOWED[package])
    }
    assert not broken, sorted(broken)


@pytest.mark.parametrize("folder", NO_BENCH)
def test_the_simulator_and_load_generator_import_no_benchmark(folder: str) -> None:
    broken = {
        line for path in sorted((ROOT / folder).rglob("*.py")) for line in bench_imports(path)
    }
    assert not broken, sorted(broken)


def test_the_bench_rule_allows_only_the_named_import(tmp_path: Path) -> None:
    """The exception names one import of one file: another name beside it, the module
    itself, the same import elsewhere, and ``from kvserve import bench`` all count."""
    sim = tmp_path / "kvserve" / "sim"
    sim.mkdir(parents=True)
    validate, other = sim / "validate.py", sim / "other.py"
    validate.write_text("from kvserve.bench.compare import run_deployment\n")
    assert bench_imports(validate, tmp_path) == set()
    validate.write_text("from kvserve.bench.compare import run_deployment, started\n")
    assert bench_imports(validate, tmp_path) == {
        "kvserve/sim/validate.py imports kvserve.bench.compare.started"
    }
    validate.write_text("def f():\n    import kvserve.bench.compare\n")
    assert bench_imports(validate, tmp_path) == {
        "kvserve/sim/validate.py imports kvserve.bench.compare"
    }
    other.write_text("from kvserve.bench.compare import run_deployment\n")
    assert bench_imports(other, tmp_path) == {
        "kvserve/sim/other.py imports kvserve.bench.compare.run_deployment"
    }
    other.write_text("from kvserve import bench\nfrom ..bench.serve import timed\n")
    assert bench_imports(other, tmp_path) == {
        "kvserve/sim/other.py imports kvserve.bench",
        "kvserve/sim/other.py imports kvserve.bench.serve.timed",
    }


@pytest.mark.parametrize("package", ONE_TOKENIZER)
def test_the_tokenizer_is_loaded_only_through_the_shared_wrapper(package: str) -> None:
    broken = {
        line
        for path in sources(package)
        if path.relative_to(ROOT).as_posix() not in TOKENIZER_HOMES
        for line in tokenizer_imports(path)
    }
    assert not broken, sorted(broken)


def test_the_tokenizer_rule_sees_the_library_and_the_classes(tmp_path: Path) -> None:
    module = tmp_path / "router" / "probe.py"
    module.parent.mkdir()
    module.write_text(
        "from tokenizers.decoders import DecodeStream\nimport transformers\n"
        "def f():\n    from transformers import AutoTokenizer, AutoConfig\n"
    )
    assert tokenizer_imports(module, tmp_path) == {
        "router/probe.py imports tokenizers.decoders.DecodeStream",
        "router/probe.py imports transformers.AutoTokenizer",
    }


@pytest.mark.parametrize("path", PURE)
def test_pure_bookkeeping_imports_no_tensors_and_no_io(path: str) -> None:
    found = {m for m in imports(ROOT / path) if within(m, IMPURE)}
    assert not found, found


def test_the_walk_sees_lazy_and_relative_imports(tmp_path: Path) -> None:
    """The checker itself: an import inside a function and a relative import both count."""
    module = tmp_path / "workers" / "model" / "probe.py"
    module.parent.mkdir(parents=True)
    module.write_text(
        "def f():\n    import router.api.app\nfrom .. import engine\nfrom . import x\n"
    )
    assert imports(module, tmp_path) == {"router.api.app", "workers", "workers.model"}


def test_only_the_modules_run_inside_vllm_import_its_libraries() -> None:
    """vLLM, ZeroMQ and msgspec live in vLLM's environment only: a module that imports
    them, or imports a module that does, is one of :data:`IN_VLLM`; the one way in from
    the rest is ``kvserve worker --engine vllm``, after it entered that environment."""
    in_vllm = {p.removesuffix(".py").replace("/", ".") for p in IN_VLLM}
    broken = set()
    for package in PACKAGES:
        for path in sources(package):
            relative = path.relative_to(ROOT).as_posix()
            mine = imports(path)
            if relative in IN_VLLM:
                continue
            if any(within(m, VLLM_LIBRARIES) for m in mine):
                broken.add(f"{relative} imports vLLM's libraries")
            if any(m in in_vllm for m in mine) and relative != "kvserve/verbs/worker.py":
                broken.add(f"{relative} imports a module that runs inside vLLM")
    assert not broken, sorted(broken)


def test_the_project_has_no_import_circles() -> None:
    """No module reaches itself through imports (:data:`CIRCLE_FREE`): where two modules
    need each other, the shared type moves down to the module both depend on, or the lower
    module owns a Protocol the upper one satisfies."""
    found = circles(import_graph(CIRCLE_FREE))
    assert not found, "\n".join(found)


def test_the_circle_check_sees_a_circle(tmp_path: Path) -> None:
    """The checker itself, on a tiny project: a circle through a lazy import, a
    ``TYPE_CHECKING`` import and ``from pkg import submodule`` is found and named; an import
    of a package's ``__init__`` is an edge to it; a chain without a circle passes."""
    files = {
        "workers/__init__.py": "from workers.c import C\n",
        "workers/a.py": "from workers import b\n",
        "workers/b.py": "def f():\n    from . import c\n",
        "workers/c.py": (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import workers.a\n"
        ),
        "workers/d.py": "import workers.c\nfrom workers import C\n",
        "kvpool/e.py": "from workers.d import f\n",
    }
    for relative, text in files.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text)
    graph = import_graph(("workers", "kvpool"), tmp_path)
    assert graph["workers.d"] == {"workers", "workers.c"}
    assert graph["workers"] == {"workers.c"}
    assert circles(graph) == ["workers.a -> workers.b -> workers.c -> workers.a"]
    (tmp_path / "workers/c.py").write_text("")
    assert circles(import_graph(("workers", "kvpool"), tmp_path)) == []
    (tmp_path / "workers/c.py").write_text("import kvpool.e\n")
    assert circles(import_graph(("workers", "kvpool"), tmp_path)) == [
        "kvpool.e -> workers.d -> workers -> workers.c -> kvpool.e",
        "kvpool.e -> workers.d -> workers.c -> kvpool.e",
    ]


def test_strongly_connected_components_of_a_small_graph() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": {"d"}, "f": {"f"}}
    assert strongly_connected(graph) == [["a", "b", "c"], ["d", "e"], ["f"]]
    assert circles(graph) == ["a -> b -> c -> a", "d -> e -> d"]

"""The sub-packages of ``router`` and ``workers`` in layers (docs/architecture.md, section 1):
a module of a sub-package imports only its own sub-package, those of lower layers, and the
root modules :data:`ROOT_MODULES` lets it; a root module imports only what its rule names.

- ``router``: ``placement`` < ``flow`` < ``observability`` < ``control`` < ``api``; the root
  modules are ``errors`` and ``config`` (below every layer, save the settings ``config``
  parses), ``service`` (the router without HTTP: every layer but ``api``, which alone
  imports it) and ``main``;
- ``workers``: ``model`` < ``core`` < ``handoff`` < ``engine`` < ``serve``; the root module
  ``config`` (every layer's settings) imports none of them.

Imports of other packages are :mod:`tests.unit.test_import_rules`'s business.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.test_import_rules import ROOT, import_graph, module_name, sources, within

LAYERS: dict[str, tuple[str, ...]] = {
    "router": ("placement", "flow", "observability", "control", "api"),
    "workers": ("model", "core", "handoff", "engine", "serve"),
}
"""Package -> its sub-packages, lowest first."""
ROOT_MODULES: dict[str, dict[str, tuple[str, ...]]] = {
    "router": {
        "errors": (),
        "config": ("errors", "api.auth", "api.edge", "control.ratio_config"),
        "service": ("errors", "config", "placement", "flow", "observability", "control"),
        "main": ("errors", "config", "service", "api"),
    },
    "workers": {"config": ()},
}
"""Package -> root module -> what it may import of its package (sub-packages or modules)."""
SHARED: dict[str, tuple[str, ...]] = {"router": ("errors", "config"), "workers": ("config",)}
"""Package -> the root modules every sub-package may import."""
ABOVE: dict[str, dict[str, tuple[str, ...]]] = {"router": {"api": ("service",)}, "workers": {}}
"""Package -> sub-package -> the root modules above the layers that it alone may import
(the HTTP edge drives the router without HTTP)."""


def allowed(package: str, module: str) -> tuple[str, ...]:
    """What ``module`` (dotted, in ``package``) may import of ``package``, as prefixes."""
    relative = module.removeprefix(f"{package}.")
    layers = LAYERS[package]
    top = relative.split(".")[0]
    if top in layers:
        above = ABOVE[package].get(top, ())
        names = (*layers[: layers.index(top) + 1], *SHARED[package], *above)
    else:
        names = ROOT_MODULES[package][relative]
    return tuple(f"{package}.{n}" for n in names)


def broken_imports(package: str, root: Path = ROOT) -> set[str]:
    """Each import of ``package``'s own modules that its layer does not allow, as text."""
    found = set()
    for module, targets in import_graph((package,), root).items():
        if module == package:
            continue
        rule = allowed(package, module)
        found |= {f"{module} imports {t}" for t in targets if t != package and not within(t, rule)}
    return found


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_each_sub_package_imports_only_its_own_layer_and_below(package: str) -> None:
    broken = broken_imports(package)
    assert not broken, sorted(broken)


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_every_module_sits_in_a_layer_or_has_a_rule(package: str) -> None:
    """A new sub-package or root module must be placed: no module falls outside the table."""
    homeless = set()
    for path in sources(package):
        relative = module_name(path).removeprefix(f"{package}.")
        top = relative.split(".")[0]
        if relative != package and top not in (*LAYERS[package], *ROOT_MODULES[package]):
            homeless.add(relative)
    assert not homeless, sorted(homeless)


def test_the_layer_check_sees_an_upward_import(tmp_path: Path) -> None:
    """The checker itself: a placement module importing the flow (a higher layer) and a
    root ``errors`` importing anything are named; the flow importing placement is not."""
    files = {
        "router/__init__.py": "",
        "router/errors.py": "from router.config import X\n",
        "router/config.py": "",
        "router/placement/__init__.py": "",
        "router/placement/a.py": "def f():\n    from router.flow import b\n",
        "router/flow/__init__.py": "",
        "router/flow/b.py": "from router.placement.a import f\nfrom router import errors\n",
    }
    for relative, text in files.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text)
    assert broken_imports("router", tmp_path) == {
        "router.errors imports router.config",
        "router.placement.a imports router.flow.b",
    }

"""The optional parts of kvserve (pyproject.toml's extras) and the message a command gives
when it needs one that is not installed.

- ``pool-cpu`` / ``pool-cuda``: the KV pool, Mooncake Store in its CPU or CUDA build (one of
  the two: they install the same ``mooncake`` package);
- ``bench``: ``kvserve bench``, ``loadgen`` and ``chaos`` (aiohttp, matplotlib, rich).

A worker, the router and ``kvserve up`` import none of the bench modules; a worker without
the pool serves from its own KV cache (:mod:`kvpool.store` says why it has no pool).
"""

from __future__ import annotations

POOL = "pool-cpu"
"""The pool extra of a machine without a GPU driver (``pool-cuda`` where there is one:
:func:`install_hint` of it says so)."""
EXTRAS: dict[str, str] = {"aiohttp": "bench", "matplotlib": "bench", "rich": "bench"}
"""Top-level module -> the extra that brings it (the pool's module: :func:`install_hint`)."""


def install_hint(extra: str) -> str:
    """How to install ``extra``: the pip command, and that scripts/setup.sh installs all."""
    other = " or 'kvserve[pool-cuda]' on a GPU machine" if extra == POOL else ""
    return f"pip install 'kvserve[{extra}]'{other} (scripts/setup.sh installs every extra)"


def missing_extra(exc: ModuleNotFoundError) -> str | None:
    """The one-line message for ``exc`` when the missing module belongs to an extra, else
    ``None`` (a missing core module is a broken install: let it raise)."""
    module = (exc.name or "").partition(".")[0]
    extra = EXTRAS.get(module)
    if extra is None:
        return None
    return f"this command needs {module}, from kvserve's {extra} extra: {install_hint(extra)}"

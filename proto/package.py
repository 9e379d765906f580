"""This installation of kvserve: its version, as the router's ``/version`` and
``kvserve --version`` report it."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version


def package_version() -> str:
    """kvserve's installed version; "unknown" when it runs from a checkout never installed."""
    try:
        return version("kvserve")
    except PackageNotFoundError:
        return "unknown"

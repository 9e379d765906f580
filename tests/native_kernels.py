"""Tests that need the C++ attention kernels (:mod:`workers.model.native`)."""

from __future__ import annotations

import os

import pytest

from workers.model import native


def require_native() -> None:
    """Skip the calling test where the kernels could not be built, except in CI (``CI`` set),
    whose setup builds them: there a missing kernel is a failure, not a skip."""
    if native.available():
        return
    reason = f"native attention kernels unavailable: {native.unavailable_reason()}"
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)

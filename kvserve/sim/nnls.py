"""Non-negative least squares (Lawson & Hanson's active-set method), numpy only.

``nnls(A, b)`` returns the ``x >= 0`` that minimises ``||A x - b||_2``. Columns of very
different magnitudes should be scaled by the caller (see :meth:`LinearCost.fit`): the
tolerance below is relative to ``A``'s norm.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

Array = NDArray[np.float64]


def nnls(a: Array, b: Array, max_iter: int | None = None) -> Array:
    """Lawson-Hanson NNLS. ``a`` is ``m x n``, ``b`` length ``m``; raises RuntimeError if
    it has not converged after ``max_iter`` (default ``3 n``) outer iterations."""
    m, n = a.shape
    if b.shape != (m,):
        raise ValueError(f"b has shape {b.shape}, expected ({m},)")
    tol = 10 * np.finfo(float).eps * float(np.linalg.norm(a, 1)) * max(m, n)
    passive = np.zeros(n, dtype=bool)
    x = np.zeros(n)
    for _ in range(max_iter if max_iter is not None else 3 * n):
        gradient = a.T @ (b - a @ x)
        candidates = ~passive & (gradient > tol)
        if not candidates.any():
            return x
        chosen = int(np.argmax(np.where(candidates, gradient, -np.inf)))
        passive[chosen] = True
        x = _inner_loop(a, b, x, passive, tol)
        if not passive[chosen]:  # its gradient was positive only by rounding: converged
            return x
    raise RuntimeError(f"nnls did not converge in {max_iter or 3 * n} iterations")


def _inner_loop(a: Array, b: Array, x: Array, passive: NDArray[np.bool_], tol: float) -> Array:
    """Solve on the passive set; while that breaks ``x >= 0``, step back towards the old
    ``x`` as far as feasibility allows and drop the columns that hit zero (mutates
    ``passive``)."""
    while True:
        z = np.zeros_like(x)
        z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
        if (z[passive] > tol).all():
            return z
        blocked = passive & (z <= tol)
        step = x[blocked] - z[blocked]  # >= 0 since z <= tol < x or x == 0 (just added)
        alpha = float(np.min(np.divide(x[blocked], step, out=np.zeros_like(step), where=step > 0)))
        x = x + alpha * (z - x)
        passive &= x > tol
        x[~passive] = 0.0
        if not passive.any():
            return x

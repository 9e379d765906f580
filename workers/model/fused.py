"""The decoder's pointwise ops fused in C++ (:mod:`workers.model.native`'s extension).

The model takes this path wherever it takes the native attention (``batch.native``: the CPU
with the kernels built) and its activations are float32; everywhere else it runs the torch
composition these replace (:class:`workers.model.llama.RMSNorm`,
:func:`workers.model.rope.apply_rotary`, ``F.silu(gate) * up``). Each op reads and writes
its rows once instead of a pass and a temporary per torch op (the torch ops took 23 ms of
the tiny model's 312 ms 512-token prefill step on one core; the step with these, 293 ms:
docs/benchmarks.md, section 6). Results equal the torch path's up to fp32 rounding (summation order,
fused multiply-adds, a polynomial ``exp``).

Every tensor is float32 on the CPU and contiguous in its last dimension (row strides are
free: views into a fused projection's output are fine); shapes are checked and a mismatch
raises ``RuntimeError``. The ops release the GIL.
"""

from __future__ import annotations

import torch

from workers.model import native


def usable(x: torch.Tensor) -> bool:
    """Whether activations like ``x`` take the fused path (given the native kernels)."""
    return x.dtype == torch.float32 and x.device.type == "cpu"


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * x / sqrt(mean(x**2) + eps)`` over the last dimension of ``x`` ``[T, n]``,
    into a new tensor."""
    out = torch.empty(x.shape, dtype=x.dtype)
    native.ops().rms_norm(out, x, weight, eps)
    return out


def add_rms_norm_(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> None:
    """In place: ``residual += x``, then ``x`` becomes :func:`rms_norm` of the new
    ``residual``. Both ``[T, n]``, neither a view of the other."""
    native.ops().add_rms_norm(x, residual, weight, eps)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for ``x = [gate | up]`` ``[T, 2n]``, into a new ``[T, n]``."""
    out = torch.empty((x.shape[0], x.shape[1] // 2), dtype=x.dtype)
    native.ops().silu_and_mul(out, x)
    return out


def rotary_(q: torch.Tensor, k: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor]) -> None:
    """Rotate ``q`` ``[T, Hq, D]`` and ``k`` ``[T, Hkv, D]`` in place by the step's
    :meth:`~workers.model.rope.RotaryTable.lookup` (``[T, 1, D]`` each), as
    :func:`~workers.model.rope.apply_rotary` does out of place."""
    cos, sin = cos_sin
    native.ops().rotary(q, k, cos.view(cos.shape[0], -1), sin.view(sin.shape[0], -1))

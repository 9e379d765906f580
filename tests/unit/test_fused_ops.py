"""The fused pointwise ops (:mod:`workers.model.fused`) against the torch composition they
replace in the model (:class:`workers.model.llama.RMSNorm`, ``F.silu(gate) * up``,
:func:`workers.model.rope.apply_rotary`), on row-strided views and widths that leave a
vector tail, on one and two threads; and their checks of what they are given.

Skips where the kernels cannot be built, except in CI (``CI`` set), as
``tests/unit/test_paged_kernel.py`` does.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.native_kernels import require_native
from tests.unit.test_paged_kernel import num_threads
from workers.model import fused, native
from workers.model.config import RopeConfig
from workers.model.llama import RMSNorm
from workers.model.rope import RotaryTable, apply_rotary

ATOL = 1e-5


@pytest.fixture(autouse=True)
def _require_native() -> None:
    require_native()


def norm_module(width: int, seed: int) -> RMSNorm:
    norm = RMSNorm(width, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(width, generator=torch.Generator().manual_seed(seed)) + 0.5)
    return norm


def strided_rows(rows: int, width: int, seed: int) -> torch.Tensor:
    """``[rows, width]`` rows 3 columns further apart than ``width`` (a view)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, width + 3, generator=g) * 3)[:, 1 : width + 1]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("rows, width", [(1, 8), (5, 37), (67, 512), (300, 96)])
def test_rms_norm_matches_the_module(rows: int, width: int, threads: int) -> None:
    norm, x = norm_module(width, rows), strided_rows(rows, width, width)
    with num_threads(threads), torch.inference_mode():
        got, want = norm.fused_forward(x), norm(x)
    assert x.stride(0) == width + 3
    torch.testing.assert_close(got, want, atol=ATOL, rtol=1e-5)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("rows, width", [(1, 8), (7, 45), (129, 512)])
def test_add_rms_norm_adds_the_residual_then_normalizes(
    rows: int, width: int, threads: int
) -> None:
    norm = norm_module(width, 7)
    x, residual = strided_rows(rows, width, 1), strided_rows(rows, width, 2)
    want_residual = residual + x
    want_x = norm(want_residual)
    with num_threads(threads), torch.inference_mode():
        norm.add_fused_(x, residual)
    torch.testing.assert_close(residual, want_residual, atol=0, rtol=0)
    torch.testing.assert_close(x, want_x, atol=ATOL, rtol=1e-5)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("rows, width", [(1, 4), (3, 21), (200, 1024)])
def test_silu_and_mul_matches_torch(rows: int, width: int, threads: int) -> None:
    x = strided_rows(rows, 2 * width, 3) * 10  # far into both tails of the sigmoid
    gate, up = x.chunk(2, dim=-1)
    with num_threads(threads), torch.inference_mode():
        got = fused.silu_and_mul(x)
    torch.testing.assert_close(got, F.silu(gate) * up, atol=ATOL, rtol=1e-5)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("head_dim", [64, 80, 10])
def test_rotary_matches_apply_rotary_in_place(head_dim: int, threads: int) -> None:
    tokens, q_heads, kv_heads = 33, 8, 2
    table = RotaryTable(RopeConfig(), head_dim, 4096, torch.float32, torch.device("cpu"))
    positions = torch.randint(0, 4096, (tokens,), generator=torch.Generator().manual_seed(0))
    cos_sin = table.lookup(positions)
    width = (q_heads + 2 * kv_heads) * head_dim
    qkv = strided_rows(tokens, width, 4)  # q and k: views into one projection's output
    q_end, k_end = q_heads * head_dim, (q_heads + kv_heads) * head_dim
    q = qkv[:, :q_end].view(tokens, q_heads, head_dim)
    k = qkv[:, q_end:k_end].view(tokens, kv_heads, head_dim)
    want_q, want_k = apply_rotary(q, k, cos_sin)
    v_before = qkv[:, k_end:].clone()
    with num_threads(threads), torch.inference_mode():
        fused.rotary_(q, k, cos_sin)
    torch.testing.assert_close(q, want_q, atol=ATOL, rtol=1e-5)
    torch.testing.assert_close(k, want_k, atol=ATOL, rtol=1e-5)
    assert torch.equal(qkv[:, k_end:], v_before)


def test_the_ops_refuse_what_they_cannot_take() -> None:
    weight = torch.ones(8)
    with pytest.raises(RuntimeError, match="float32"):
        fused.rms_norm(torch.ones(2, 8, dtype=torch.bfloat16), weight, 1e-5)
    with pytest.raises(RuntimeError, match="weight"):
        fused.rms_norm(torch.ones(2, 8), torch.ones(9), 1e-5)
    with pytest.raises(RuntimeError, match="last dimension"):
        fused.rms_norm(torch.ones(8, 2).t(), weight, 1e-5)
    with pytest.raises(RuntimeError, match="residual"):
        fused.add_rms_norm_(torch.ones(2, 8), torch.ones(3, 8), weight, 1e-5)
    with pytest.raises(RuntimeError, match="2 \\* width"):
        native.ops().silu_and_mul(torch.empty(2, 4), torch.ones(2, 7))
    cos_sin = (torch.ones(3, 1, 8), torch.ones(3, 1, 8))
    with pytest.raises(RuntimeError, match="k must be"):
        fused.rotary_(torch.ones(3, 2, 8), torch.ones(4, 2, 8), cos_sin)
    with pytest.raises(RuntimeError, match="even"):
        fused.rotary_(torch.ones(3, 2, 7), torch.ones(3, 2, 7), cos_sin)

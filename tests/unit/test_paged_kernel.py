"""The native paged-attention kernels (:mod:`workers.model.native`) against pure torch.

The reference gathers each sequence's pages and runs SDPA in float64 with the causal mask
offset by the cached prefix. Batches are random: pages shuffled and not reused, ragged
contexts, GQA 1/2/4, block sizes 16/64/128, chunks starting mid-block, decode-only and
mixed batches, one or two threads (so the split-context path runs too).

The tests skip where the kernels cannot be built, except in CI (``CI`` set): the setup
script builds them there, so a failed build fails these tests.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.native_kernels import require_native
from workers.model import native

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True)


@pytest.fixture(autouse=True)
def _require_native() -> None:
    require_native()


@contextmanager
def num_threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass
class Case:
    """One call's inputs; ``lead``/``tail`` rows of q belong to no sequence."""

    q: torch.Tensor
    cache: torch.Tensor
    block_tables: torch.Tensor
    context_lens: torch.Tensor
    query_starts: torch.Tensor
    scale: float


def make_case(
    seqs: list[tuple[int, int]],
    *,
    q_heads: int,
    kv_heads: int,
    head_dim: int,
    block_tokens: int,
    dtype: torch.dtype,
    seed: int,
    lead: int = 0,
    tail: int = 0,
    spare_blocks: int = 3,
) -> Case:
    """``seqs``: (cached tokens before this step, queries this step) per sequence. Pages
    are a random permutation (none shared); table padding is garbage (-1 and huge)."""
    gen = torch.Generator().manual_seed(seed)
    pages_per = [-(-(cached + n) // block_tokens) for cached, n in seqs]
    num_blocks = sum(pages_per) + spare_blocks
    cache = torch.randn(num_blocks, 2, block_tokens, kv_heads, head_dim, generator=gen)
    perm = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    width = max(pages_per, default=0) + 2
    tables = torch.full((len(seqs), width), -1, dtype=torch.int32)
    tables[:, -1] = 2**30
    used = 0
    for s, n in enumerate(pages_per):
        tables[s, :n] = perm[used : used + n]
        used += n
    total_q = sum(n for _, n in seqs)
    starts = [lead]
    for _, n in seqs:
        starts.append(starts[-1] + n)
    q = torch.randn(lead + total_q + tail, q_heads, head_dim, generator=gen)
    return Case(
        q=q.to(dtype),
        cache=cache.to(dtype),
        block_tables=tables,
        context_lens=torch.tensor([c + n for c, n in seqs], dtype=torch.int32),
        query_starts=torch.tensor(starts, dtype=torch.int32),
        scale=1.0 / math.sqrt(head_dim),
    )


def reference(case: Case) -> torch.Tensor:
    """float64 ``[T, q_heads, head_dim]``; rows in no sequence are NaN."""
    q, cache = case.q, case.cache
    out = torch.full(q.shape, math.nan, dtype=torch.float64)
    bt, kv_heads, head_dim = cache.shape[2:]
    for s in range(case.context_lens.shape[0]):
        a, b = int(case.query_starts[s]), int(case.query_starts[s + 1])
        ctx = int(case.context_lens[s])
        if b == a:
            continue
        pages = cache[case.block_tables[s, : -(-ctx // bt)].long()].double()
        k = pages[:, 0].reshape(-1, kv_heads, head_dim)[:ctx].transpose(0, 1)
        v = pages[:, 1].reshape(-1, kv_heads, head_dim)[:ctx].transpose(0, 1)
        positions = torch.arange(ctx - (b - a), ctx)
        mask = torch.arange(ctx)[None, :] <= positions[:, None]
        o = F.scaled_dot_product_attention(
            q[a:b].double().transpose(0, 1)[None],
            k[None],
            v[None],
            attn_mask=mask,
            scale=case.scale,
            enable_gqa=True,
        )
        out[a:b] = o[0].transpose(0, 1)
    return out


def run_and_check(case: Case, *, rtol: float, atol: float) -> None:
    sentinel = 1234.5
    out = torch.full_like(case.q, sentinel)
    native.paged_attention(
        out,
        case.q,
        case.cache,
        case.block_tables,
        case.context_lens,
        case.query_starts,
        case.scale,
    )
    ref = reference(case)
    inside = ~ref[:, 0, 0].isnan()
    assert_close(out[inside], ref[inside], rtol=rtol, atol=atol)
    assert bool((out[~inside] == sentinel).all()), "rows in no sequence must be untouched"


def assert_close(out: torch.Tensor, ref: torch.Tensor, *, rtol: float, atol: float) -> None:
    """|out - ref| <= atol + rtol * |ref| everywhere (a cheap torch.testing.assert_close)."""
    excess = (out.double() - ref).abs() - (atol + rtol * ref.abs())
    worst = int(excess.flatten().argmax()) if excess.numel() else 0
    assert excess.numel() == 0 or float(excess.flatten()[worst]) <= 0, (
        f"mismatch at flat index {worst}: {float(out.flatten()[worst])} vs "
        f"{float(ref.flatten()[worst])} (rtol {rtol}, atol {atol})"
    )


TOLERANCE = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-2, 2e-2)}


@st.composite
def shapes(draw: st.DrawFn) -> dict[str, int]:
    kv_heads = draw(st.sampled_from([1, 2, 3]))
    return {
        "kv_heads": kv_heads,
        "q_heads": kv_heads * draw(st.sampled_from([1, 2, 4])),
        "head_dim": draw(st.sampled_from([64, 64, 32, 36])),  # 36: not a vector multiple
        "block_tokens": draw(st.sampled_from([16, 64, 128])),
    }


# (cached tokens, queries): decodes, chunks over a cached prefix (often mid-block), chunks
# that start a prompt, and the odd sequence with no queries this step.
decode_seq = st.tuples(st.integers(0, 700), st.just(1))
chunk_seq = st.tuples(st.integers(0, 300), st.integers(1, 80))
empty_seq = st.tuples(st.integers(1, 50), st.just(0))


@SETTINGS
@given(
    shape=shapes(),
    seqs=st.lists(decode_seq, min_size=1, max_size=12),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    nthreads=st.sampled_from([1, 2]),
    seed=st.integers(0, 2**16),
)
def test_decode_batches(
    shape: dict[str, int],
    seqs: list[tuple[int, int]],
    dtype: torch.dtype,
    nthreads: int,
    seed: int,
) -> None:
    rtol, atol = TOLERANCE[dtype]
    with num_threads(nthreads):
        run_and_check(make_case(seqs, dtype=dtype, seed=seed, **shape), rtol=rtol, atol=atol)


@SETTINGS
@given(
    shape=shapes(),
    seqs=st.lists(st.one_of(decode_seq, chunk_seq, empty_seq), min_size=1, max_size=6),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    nthreads=st.sampled_from([1, 2]),
    lead=st.integers(0, 2),
    tail=st.integers(0, 2),
    seed=st.integers(0, 2**16),
)
def test_mixed_batches(
    shape: dict[str, int],
    seqs: list[tuple[int, int]],
    dtype: torch.dtype,
    nthreads: int,
    lead: int,
    tail: int,
    seed: int,
) -> None:
    case = make_case(seqs, dtype=dtype, seed=seed, lead=lead, tail=tail, **shape)
    rtol, atol = TOLERANCE[dtype]
    with num_threads(nthreads):
        run_and_check(case, rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("seqs", [[(2047, 1)], [(1500, 1), (900, 1)], [(1800, 8)]])
def test_long_contexts_split(seqs: list[tuple[int, int]], dtype: torch.dtype) -> None:
    """Few long sequences on two threads: the context is split and merged."""
    case = make_case(seqs, q_heads=8, kv_heads=2, head_dim=64, block_tokens=64, dtype=dtype, seed=1)
    tol = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}[dtype]
    with num_threads(2):
        run_and_check(case, rtol=tol, atol=tol)


def test_strided_q_and_out() -> None:
    """q and out may be views (e.g. into a fused QKV projection): only the last dimension
    must be contiguous."""
    case = make_case(
        [(30, 5), (0, 1), (100, 1)],
        q_heads=4,
        kv_heads=2,
        head_dim=64,
        block_tokens=16,
        dtype=torch.float32,
        seed=3,
    )
    t = case.q.shape[0]
    qkv = torch.randn(t, 8 * 64)
    q = qkv[:, 64 : 64 + 4 * 64].view(t, 4, 64)
    q.copy_(case.q)
    out_big = torch.zeros(t, 6, 64)
    out = out_big[:, 1:5]
    native.paged_attention(
        out, q, case.cache, case.block_tables, case.context_lens, case.query_starts, case.scale
    )
    assert_close(out, reference(case), rtol=1e-5, atol=1e-5)
    assert bool((out_big[:, 0] == 0).all() and (out_big[:, 5] == 0).all())


def test_rejects_bad_arguments() -> None:
    case = make_case(
        [(10, 2)],
        q_heads=4,
        kv_heads=2,
        head_dim=32,
        block_tokens=16,
        dtype=torch.float32,
        seed=0,
    )
    out = torch.empty_like(case.q)
    args = (case.cache, case.block_tables, case.context_lens, case.query_starts, case.scale)
    with pytest.raises(RuntimeError, match="block_tables must be Int"):
        native.paged_attention(out, case.q, case.cache, case.block_tables.long(), *args[2:])
    with pytest.raises(RuntimeError, match="multiple of kv_heads"):
        native.paged_attention(out[:, :3], case.q[:, :3], *args)
    with pytest.raises(RuntimeError, match="is less than its 2 queries"):
        native.paged_attention(
            out,
            case.q,
            case.cache,
            case.block_tables,
            torch.tensor([1], dtype=torch.int32),
            case.query_starts,
            case.scale,
        )
    bad_tables = case.block_tables.clone()
    bad_tables[0, 0] = case.cache.shape[0]
    with pytest.raises(RuntimeError, match="is not a page of the cache"):
        native.paged_attention(out, case.q, case.cache, bad_tables, *args[2:])
    with pytest.raises(RuntimeError, match="out must match"):
        native.paged_attention(out.double(), case.q, *args)


@SETTINGS
@given(
    tokens=st.integers(0, 40),
    block_tokens=st.sampled_from([16, 64]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
    fused=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_write_kv(
    tokens: int, block_tokens: int, dtype: torch.dtype, fused: bool, seed: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    kv_heads, head_dim, num_blocks = 2, 32, 4
    cache = torch.randn(num_blocks, 2, block_tokens, kv_heads, head_dim, generator=gen).to(dtype)
    slots = torch.randperm(num_blocks * block_tokens, generator=gen)[:tokens]
    skip = torch.rand(tokens, generator=gen) < 0.25
    slots[skip] = -1
    if fused:  # views into a [T, (q + k + v) * head_dim] projection: strided rows
        qkv = torch.randn(tokens, 8 * head_dim, generator=gen).to(dtype)
        k = qkv[:, 4 * head_dim : 6 * head_dim].view(tokens, kv_heads, head_dim)
        v = qkv[:, 6 * head_dim :].view(tokens, kv_heads, head_dim)
    else:
        k = torch.randn(tokens, kv_heads, head_dim, generator=gen).to(dtype)
        v = torch.randn(tokens, kv_heads, head_dim, generator=gen).to(dtype).transpose(1, 2)
        v = v.contiguous().transpose(1, 2)  # a non-unit last stride
    expected = cache.clone()
    keep = slots >= 0
    pages, offsets = slots[keep] // block_tokens, slots[keep] % block_tokens
    expected[pages, 0, offsets] = k[keep]
    expected[pages, 1, offsets] = v[keep]
    native.write_kv(k, v, cache, slots)
    assert torch.equal(cache, expected)


def test_write_kv_rejects_bad_arguments() -> None:
    cache = torch.zeros(2, 2, 16, 2, 32)
    k = torch.randn(3, 2, 32)
    slots = torch.tensor([0, 5, -1])
    with pytest.raises(RuntimeError, match="cache's dtype"):
        native.write_kv(k.bfloat16(), k.bfloat16(), cache, slots)
    with pytest.raises(RuntimeError, match="past the cache"):
        native.write_kv(k, k, cache, torch.tensor([0, 64, 1]))
    with pytest.raises(RuntimeError, match="slot_mapping must be Long"):
        native.write_kv(k, k, cache, slots.int())
    with pytest.raises(RuntimeError, match=r"k and v must be \[T, kv_heads, head_dim\]"):
        native.write_kv(k[:, :1], k[:, :1], cache, slots)

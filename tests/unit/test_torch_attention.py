"""The pure-torch paged attention (:func:`workers.model.attention.paged_attention` without
the native kernels), the path CUDA takes, checked on the CPU.

Each case is a batch in the order :class:`AttentionBatch` wants (decodes, chunks over a
cached prefix, chunks that start a prompt), with ragged lengths, pages shuffled and block
tables padded with page 0 past each sequence's need. The reference knows every sequence's
whole K/V and runs causal attention over it in float64, independently of the pages.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from workers.model.attention import AttentionBatch, DecodeKernel, decode_kernel_for, paged_attention

BLOCK = 16
HEAD_DIM = 32
KERNELS: tuple[DecodeKernel, ...] = ("matmul", "sdpa")
# (cached tokens before this step, queries this step): decodes, chunks over a prefix, fresh
MIXED = [(0, 1), (40, 1), (16, 1), (5, 1), (20, 7), (33, 16), (0, 9), (0, 1)]
DECODES = [(70, 1), (0, 1), (15, 1), (16, 1), (31, 1)]


@dataclass
class Case:
    """A step's inputs (``q``/``k``/``v`` for its new tokens, the cache holding each
    sequence's earlier tokens) and each sequence's full K/V for the reference."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cache: torch.Tensor
    seqs: list[tuple[int, int]]
    full_k: list[torch.Tensor]
    full_v: list[torch.Tensor]
    tables: torch.Tensor
    slots: torch.Tensor


def make_case(seqs: list[tuple[int, int]], q_heads: int, kv_heads: int, seed: int) -> Case:
    """fp32 tensors for ``seqs``; pages 1.. shuffled (page 0 is the padding)."""
    gen = torch.Generator().manual_seed(seed)
    need = [-(-(c + n) // BLOCK) for c, n in seqs]
    pages = (torch.randperm(sum(need), generator=gen) + 1).tolist()
    cache = torch.randn(sum(need) + 1, 2, BLOCK, kv_heads, HEAD_DIM, generator=gen)
    tables = torch.zeros(len(seqs), max(need) + 2, dtype=torch.int32)  # two spare columns
    full_k, full_v, q, k, v, slots = [], [], [], [], [], []
    for s, (cached, n) in enumerate(seqs):
        own, pages = pages[: need[s]], pages[need[s] :]
        tables[s, : need[s]] = torch.tensor(own, dtype=torch.int32)
        kk, vv = (torch.randn(cached + n, kv_heads, HEAD_DIM, generator=gen) for _ in "kv")
        full_k.append(kk)
        full_v.append(vv)
        for pos in range(cached + n):
            page, offset = own[pos // BLOCK], pos % BLOCK
            if pos < cached:
                cache[page, 0, offset], cache[page, 1, offset] = kk[pos], vv[pos]
            else:
                slots.append(page * BLOCK + offset)
        q.append(torch.randn(n, q_heads, HEAD_DIM, generator=gen))
        k.append(kk[cached:])
        v.append(vv[cached:])
    return Case(
        q=torch.cat(q),
        k=torch.cat(k),
        v=torch.cat(v),
        cache=cache,
        seqs=seqs,
        full_k=full_k,
        full_v=full_v,
        tables=tables,
        slots=torch.tensor(slots, dtype=torch.long),
    )


def run(case: Case, kernel: DecodeKernel, dtype: torch.dtype) -> torch.Tensor:
    """:func:`paged_attention` over ``case`` in ``dtype`` (on a copy of its cache). The
    leading one-query sequences are the decodes; the chunks that follow with a cached
    prefix read pages, the rest start their prompt."""
    num_decode = next((i for i, (_, n) in enumerate(case.seqs) if n != 1), len(case.seqs))
    num_paged = num_decode + sum(1 for c, n in case.seqs[num_decode:] if c > 0)
    qlens = [n for _, n in case.seqs]
    clens = [c + n for c, n in case.seqs]
    starts = torch.zeros(len(qlens) + 1, dtype=torch.int32)
    torch.cumsum(torch.tensor(qlens, dtype=torch.int32), 0, out=starts[1:])
    batch = AttentionBatch(
        slot_mapping=case.slots,
        block_tables=case.tables,
        context_lens=torch.tensor(clens, dtype=torch.int32),
        query_starts=starts,
        num_decode=num_decode,
        num_paged=num_paged,
        query_lens=qlens,
        context_lens_host=clens,
        block_tokens=BLOCK,
        decode_kernel=kernel,
    )
    cache = case.cache.to(dtype)
    q, k, v = (t.to(dtype) for t in (case.q, case.k, case.v))
    out = paged_attention(q, k, v, cache, batch, HEAD_DIM**-0.5)
    assert out.dtype == dtype
    return out


def reference(case: Case) -> torch.Tensor:
    """float64 causal attention of every sequence's queries over its whole K/V."""
    out = []
    at = 0
    for (cached, n), kk, vv in zip(case.seqs, case.full_k, case.full_v, strict=True):
        q = case.q[at : at + n].double().transpose(0, 1)[None]
        mask = torch.arange(cached + n)[None, :] <= torch.arange(cached, cached + n)[:, None]
        o = F.scaled_dot_product_attention(
            q,
            kk.double().transpose(0, 1)[None],
            vv.double().transpose(0, 1)[None],
            attn_mask=mask,
            scale=HEAD_DIM**-0.5,
            enable_gqa=True,
        )
        out.append(o[0].transpose(0, 1))
        at += n
    return torch.cat(out)


def assert_close(out: torch.Tensor, ref: torch.Tensor, tol: float) -> None:
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol)


@pytest.mark.parametrize(("q_heads", "kv_heads"), [(8, 2), (4, 1), (4, 4)])
@pytest.mark.parametrize("seqs", [DECODES, MIXED], ids=["decodes", "mixed"])
def test_sdpa_decode_matches_matmul_and_reference(
    q_heads: int, kv_heads: int, seqs: list[tuple[int, int]]
) -> None:
    case = make_case(seqs, q_heads, kv_heads, seed=q_heads * 10 + kv_heads)
    matmul = run(case, "matmul", torch.float32)
    sdpa = run(case, "sdpa", torch.float32)
    torch.testing.assert_close(sdpa, matmul, rtol=1e-5, atol=1e-5)
    assert_close(sdpa, reference(case), 1e-5)
    assert_close(matmul, reference(case), 1e-5)


def test_padding_pages_are_ignored() -> None:
    """Whatever page 0 (the padding) holds, the decodes' outputs stay the same."""
    case = make_case(DECODES, 8, 2, seed=5)
    before = {kernel: run(case, kernel, torch.float32) for kernel in KERNELS}
    case.cache[0] = 1e4
    for kernel in KERNELS:
        torch.testing.assert_close(run(case, kernel, torch.float32), before[kernel])


LOW_PRECISION = {torch.bfloat16: 3e-2, torch.float16: 4e-3}


@pytest.mark.parametrize("dtype", list(LOW_PRECISION), ids=str)
@pytest.mark.parametrize("kernel", KERNELS)
def test_low_precision_tracks_fp32(dtype: torch.dtype, kernel: DecodeKernel) -> None:
    """bf16/fp16 inputs, cache and output; the result within the dtype's tolerance of the
    float64 reference of the same (rounded) inputs' fp32 values."""
    case = make_case(MIXED, 8, 2, seed=7)
    for name in ("q", "k", "v", "cache"):  # round the inputs, so only the kernel's error counts
        setattr(case, name, getattr(case, name).to(dtype).float())
    case.full_k = [t.to(dtype).float() for t in case.full_k]
    case.full_v = [t.to(dtype).float() for t in case.full_v]
    out = run(case, kernel, dtype)
    assert bool(out.isfinite().all())
    assert_close(out, reference(case), LOW_PRECISION[dtype])


def test_decode_kernel_follows_the_device() -> None:
    assert decode_kernel_for(torch.device("cpu")) == "matmul"
    assert decode_kernel_for(torch.device("cuda")) == "sdpa"
    assert decode_kernel_for(torch.device("cuda", 1)) == "sdpa"

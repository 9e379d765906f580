"""vLLM's paged KV caches seen as the pool's wire spans (torch only; no vLLM import).

The pool stores one object per (layer, block): K then V of the block's tokens, each
``[block_tokens, kv_heads, head_dim]`` (:mod:`kvpool.layout`). vLLM keeps one tensor per
attention layer, logically ``[num_blocks, kv_heads, block_tokens, 2 * head_size]``, whose
bytes are arranged differently by attention backend and CPU instruction set.
:class:`VllmViews` gives each (layer, block) span as views in the wire order, which
:class:`workers.handoff.staging.TorchCopier` copies to and from host slots: the pool then holds
the same bytes for a block whether our engine or vLLM wrote it, so a block written by one
is read by the other when model, dtype and block size agree (one wire name, one namespace:
the workers' KV contracts are equal).

Arrangements (:data:`KINDS`), each a way to find a block's K and V in ``cache[b]``, a
``[heads, tokens, 2 * head]`` tensor:

- ``k-transposed`` (vLLM's CPU build, ``CPU_ATTN`` with its ``vec`` kernels): per head, the
  block's K as ``[head, tokens]`` (transposed, for the kernel's dot products) and then its V
  as ``[tokens, head]``;
- ``kv-rows``: per head, K rows ``[tokens, head]`` then V rows;
- ``token-kv``: the last axis is each token's K then V (vLLM's CUDA backends that split the
  cache at ``head_size``: FlashAttention, Triton), in any stride order.

Which one a running vLLM uses is not taken from a table: :func:`detect` has vLLM's own
cache-update op write known K and V into a scratch block and keeps the arrangement that
reads them back exactly (the connector does this when vLLM registers its caches). A cache
none of them reads back (FlashInfer's variants, MLA, fp8, hybrid models, AMX-packed bf16)
is refused with the reason (:class:`LayoutError`): a worker that cannot write the pool's
bytes must not join it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from kvpool.layout import KVLayout
from kvpool.span_io import CacheSpan

SpanParts = Callable[[int], list[torch.Tensor]]
"""A layer's block ``b`` as views: one ``[2, tokens, heads, head]``, or K and V each
``[tokens, heads, head]`` (the wire span's two halves, in order)."""
DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


class LayoutError(ValueError):
    """vLLM's KV cache cannot be seen in the pool's wire layout (the reason says why)."""


def _k_transposed(cache: torch.Tensor) -> SpanParts:
    blocks, heads, tokens, width = cache.shape
    if not cache.is_contiguous():
        raise LayoutError("the KV cache tensor is not contiguous")
    halves = cache.view(blocks, heads, 2, tokens * (width // 2))
    dim = width // 2
    return lambda b: [
        halves[b, :, 0].view(heads, dim, tokens).permute(2, 0, 1),
        halves[b, :, 1].view(heads, tokens, dim).permute(1, 0, 2),
    ]


def _kv_rows(cache: torch.Tensor) -> SpanParts:
    blocks, heads, tokens, width = cache.shape
    if not cache.is_contiguous():
        raise LayoutError("the KV cache tensor is not contiguous")
    rows = cache.view(blocks, heads, 2, tokens, width // 2)
    return lambda b: [rows[b].permute(1, 2, 0, 3)]


def _token_kv(cache: torch.Tensor) -> SpanParts:
    if cache.stride(-1) != 1:
        raise LayoutError("the KV cache's last axis is not contiguous")
    dim = cache.shape[-1] // 2
    return lambda b: [torch.unflatten(cache[b], -1, (2, dim)).permute(2, 1, 0, 3)]


KINDS: dict[str, Callable[[torch.Tensor], SpanParts]] = {
    "k-transposed": _k_transposed,
    "kv-rows": _kv_rows,
    "token-kv": _token_kv,
}
"""Arrangement name -> how to view a block of a cache so arranged (module docstring)."""

CacheWrite = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]
"""``write(key, value, cache)``: vLLM's own op storing ``key`` and ``value`` (each
``[tokens, heads, head]``) as the tokens of block 0 of ``cache``."""


def read_span(parts: list[torch.Tensor]) -> torch.Tensor:
    """A span's views as one ``[2, tokens, heads, head]`` tensor (a copy)."""
    return parts[0].clone() if len(parts) == 1 else torch.stack(parts)


def detect(like: torch.Tensor, write: CacheWrite) -> str:
    """The arrangement of caches like ``like`` (one layer's cache): the first of
    :data:`KINDS` that reads back exactly what ``write`` stored in a scratch block.
    LayoutError if none does."""
    if like.dim() != 4 or like.shape[-1] % 2:
        raise LayoutError(f"KV cache shape {tuple(like.shape)} is not [blocks, heads, tokens, 2h]")
    if like.dtype not in DTYPE_NAMES:
        raise LayoutError(f"KV cache dtype {like.dtype}: the pool holds fp32, bf16 or fp16")
    _, heads, tokens, width = like.shape
    scratch = torch.zeros((1, heads, tokens, width), dtype=like.dtype, device=like.device)
    gen = torch.Generator().manual_seed(0)
    kv = torch.randn((2, tokens, heads, width // 2), generator=gen).to(like.dtype)
    write(kv[0].to(like.device), kv[1].to(like.device), scratch)
    for kind, view in KINDS.items():
        try:
            got = read_span(view(scratch)(0)).cpu()
        except (LayoutError, RuntimeError):
            continue
        if torch.equal(got, kv):
            return kind
    raise LayoutError(
        "vLLM's KV cache is arranged in none of the ways kvserve's connector can read "
        f"({', '.join(KINDS)}); serve this model with kvserve's engine"
    )


class VllmViews:
    """The spans of vLLM's per-layer caches (``caches``, in layer order, arranged as
    ``kind``): a :class:`workers.handoff.staging.SpanViews`. Never registered in place (the
    wire order is not the cache's), so ``cache_ptr`` is 0."""

    def __init__(self, kind: str, caches: Sequence[torch.Tensor]) -> None:
        if not caches:
            raise LayoutError("vLLM registered no attention KV cache")
        first = caches[0]
        for cache in caches:
            if cache.shape != first.shape or cache.dtype != first.dtype:
                raise LayoutError("vLLM's layers have KV caches of different shapes")
        self._parts = [KINDS[kind](cache) for cache in caches]
        self.num_blocks, heads, self.block_tokens, width = first.shape
        self.num_layers = len(caches)
        self.device, self.dtype = first.device, first.dtype
        self.span_shape: tuple[int, ...] = (2, self.block_tokens, heads, width // 2)
        self.cache_ptr = 0

    def __call__(self, span: CacheSpan) -> list[torch.Tensor]:
        return self._parts[span.layer](span.page)

    def wire_layout(self) -> KVLayout:
        """The pool's name for these spans (the KV contract's wire part)."""
        _, tokens, heads, dim = self.span_shape
        return KVLayout(
            self.num_layers, self.num_blocks, tokens, heads, dim, DTYPE_NAMES[self.dtype]
        )

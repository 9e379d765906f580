"""Attention over the paged KV cache.

A step's tokens arrive flattened into one ``[T, ...]`` batch, ordered as the
:class:`AttentionBatch` says: first the decode tokens (one per sequence), then each prefill
chunk as a contiguous span. For every layer, :func:`paged_attention`

1. writes the step's new K and V into their cache slots (one ``index_put``),
2. attends all decode queries at once over their gathered pages (padded to the longest
   context, masked), and
3. attends each prefill chunk over its own pages (or straight over the new K/V when the
   chunk starts at position 0) with a causal mask offset by the cached prefix.

The layer cache is ``[num_blocks, 2 (K, V), block_tokens, kv_heads, head_dim]`` (DESIGN.md),
so every (layer, block) pair is one contiguous span.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class PrefillSpan:
    """One sequence's chunk of new tokens inside the flattened batch.

    ``start``/``length`` locate the chunk in the batch; ``context_len`` counts the cached
    prefix plus the chunk. ``block_table`` holds the sequence's page ids when there is a
    cached prefix (``context_len > length``), else ``None``; ``mask`` is the
    ``[length, context_len]`` boolean causal mask for that case.
    """

    start: int
    length: int
    context_len: int
    block_table: torch.Tensor | None = None
    mask: torch.Tensor | None = None


@dataclass
class AttentionBatch:
    """Where a step's tokens go in the cache and what each one attends to.

    ``slot_blocks[t]``/``slot_offsets[t]`` give the page and offset of token ``t``. The first
    ``num_decode`` tokens are decode tokens: ``decode_block_tables`` is ``[B, max_blocks]``
    (padded with page 0) and ``decode_mask`` ``[B, 1, 1, max_blocks * block_tokens]`` marks
    each sequence's valid positions (``[B, 1, 1, L]`` broadcasts over heads and groups).
    """

    slot_blocks: torch.Tensor
    slot_offsets: torch.Tensor
    num_decode: int
    decode_block_tables: torch.Tensor | None
    decode_mask: torch.Tensor | None
    prefills: list[PrefillSpan]


def _gather_pages(layer_cache: torch.Tensor, block_table: torch.Tensor) -> torch.Tensor:
    """Pages ``[..., nb]`` -> ``[2, ..., kv_heads, nb * block_tokens, head_dim]``."""
    flat = layer_cache.view(layer_cache.shape[0], -1).index_select(0, block_table.flatten())
    pages = flat.view(*block_table.shape, *layer_cache.shape[1:])  # [..., nb, 2, bt, H, D]
    lead = block_table.dim() - 1
    dims = list(range(pages.dim()))
    nb, kv, bt, heads, hd = dims[lead:]
    order = [kv, *dims[:lead], heads, nb, bt, hd]
    shape = (*pages.shape[:lead], pages.shape[-2], -1, pages.shape[-1])
    return pages.permute(order).reshape(2, *shape)


def _decode_attention(
    q: torch.Tensor, kv: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """One query per sequence: ``q`` ``[B, Hq, D]``, ``kv`` ``[2, B, Hkv, L, D]``.

    Plain matmuls over query-head groups: for a single masked query, SDPA's CPU path
    measured about 4x slower than this.
    """
    b, hq, d = q.shape
    hkv = kv.shape[2]
    qg = q.view(b, hkv, hq // hkv, d)
    scores = (qg @ kv[0].transpose(-1, -2)) * scale  # [B, Hkv, G, L]
    probs = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
    return (probs @ kv[1]).view(b, hq, d)


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layer_cache: torch.Tensor,
    batch: AttentionBatch,
    scale: float,
) -> torch.Tensor:
    """Attention of ``q`` ``[T, Hq, D]``; ``k``/``v`` ``[T, Hkv, D]`` are the step's new keys
    and values. Returns ``[T, Hq, D]``."""
    layer_cache[batch.slot_blocks, :, batch.slot_offsets] = torch.stack((k, v), dim=1)
    out = torch.empty_like(q)
    nd = batch.num_decode
    if nd:
        assert batch.decode_block_tables is not None and batch.decode_mask is not None
        kv = _gather_pages(layer_cache, batch.decode_block_tables)
        out[:nd] = _decode_attention(q[:nd], kv, batch.decode_mask, scale)
    for span in batch.prefills:
        end = span.start + span.length
        qs = q[span.start : end].transpose(0, 1).unsqueeze(0)
        if span.block_table is None:
            ks = k[span.start : end].transpose(0, 1).unsqueeze(0)
            vs = v[span.start : end].transpose(0, 1).unsqueeze(0)
            o = F.scaled_dot_product_attention(
                qs, ks, vs, is_causal=True, scale=scale, enable_gqa=True
            )
        else:
            kv = _gather_pages(layer_cache, span.block_table)[:, :, : span.context_len]
            o = F.scaled_dot_product_attention(
                qs,
                kv[0].unsqueeze(0),
                kv[1].unsqueeze(0),
                attn_mask=span.mask,
                scale=scale,
                enable_gqa=True,
            )
        out[span.start : end] = o[0].transpose(0, 1)
    return out

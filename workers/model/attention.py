"""Attention over the paged KV cache.

A step's tokens arrive flattened into one ``[T, ...]`` batch of ``S`` sequences, ordered as
the :class:`AttentionBatch` says: first the decode tokens (one per sequence), then the
prefill chunks that continue a cached prefix, then the chunks that start a prompt (each a
contiguous span). For every layer, :func:`paged_attention`

1. writes the step's new K and V into their cache slots, then
2. attends the decode tokens and the chunks over a cached prefix to the cache in place
   (:mod:`workers.model.native`, a C++ kernel, when ``batch.native``; else the pure-torch
   path below, which gathers the pages), and
3. attends each chunk that starts a prompt straight over its new K/V (causal SDPA); with
   the C++ kernel these read the cache like the others (the model runner counts them as
   paged: about twice as fast as SDPA on a CPU core).

On the torch path the decodes run as one batched kernel, chosen by
``batch.decode_kernel`` (:func:`decode_kernel_for` picks it from the device): ``"matmul"``
(plain matmuls; the CPU's choice) or ``"sdpa"`` (``scaled_dot_product_attention``, so CUDA's
fused kernels apply; the CUDA choice). Both compute the same attention; softmax runs in
fp32 whatever the model dtype.

The layer cache is ``[num_blocks, 2 (K, V), block_tokens, kv_heads, head_dim]`` (DESIGN.md),
so every (layer, block) pair is one contiguous span.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

import torch
import torch.nn.functional as F

from workers.model import native

DecodeKernel = Literal["matmul", "sdpa"]
"""How the torch path attends the decodes (see the module docstring)."""


def decode_kernel_for(device: torch.device) -> DecodeKernel:
    """The decode kernel for ``device``: ``"sdpa"`` on CUDA, ``"matmul"`` elsewhere (for one
    masked query, SDPA's CPU path measured about 4x slower than the matmuls)."""
    return "sdpa" if device.type == "cuda" else "matmul"


@dataclass
class AttentionBatch:
    """Where a step's tokens go in the cache and what each one attends to.

    Per token: ``slot_mapping`` (int64 ``[T]``, ``page * block_tokens + offset``). Per
    sequence, in batch order: ``block_tables`` (int32 ``[S, W]``, padded with page 0),
    ``context_lens`` (int32 ``[S]``, cached tokens plus this step's) and ``query_starts``
    (int32 ``[S + 1]``: sequence ``s`` owns rows ``query_starts[s]:query_starts[s + 1]``).
    The first ``num_decode`` sequences have one query each; the first ``num_paged`` (decodes,
    then chunks over a cached prefix, and with ``native`` every chunk) read pages; the rest
    start their prompt in this step and attend their own new K/V (causal SDPA).
    ``query_lens`` and ``context_lens_host`` are host copies for control flow (no device
    sync). ``native`` picks the C++ kernels (CPU only); otherwise ``decode_kernel`` says
    how the torch path attends the decodes. Tensors built for the torch path are derived
    once per step and shared by every layer.
    """

    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    context_lens: torch.Tensor
    query_starts: torch.Tensor
    num_decode: int
    num_paged: int
    query_lens: list[int]
    context_lens_host: list[int]
    block_tokens: int
    native: bool = False
    decode_kernel: DecodeKernel = "matmul"
    _starts: list[int] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        starts = [0]
        for n in self.query_lens:
            starts.append(starts[-1] + n)
        self._starts = starts

    def span(self, s: int) -> tuple[int, int]:
        """Rows ``[start, end)`` of sequence ``s``."""
        return self._starts[s], self._starts[s + 1]

    @cached_property
    def slot_pages(self) -> torch.Tensor:
        return self.slot_mapping // self.block_tokens

    @cached_property
    def slot_offsets(self) -> torch.Tensor:
        return self.slot_mapping % self.block_tokens

    @cached_property
    def decode_tables(self) -> torch.Tensor:
        """int64 ``[num_decode, W']`` pages of the decodes, W' their widest need."""
        nd, bt = self.num_decode, self.block_tokens
        width = -(-max(self.context_lens_host[:nd]) // bt)
        return self.block_tables[:nd, :width].long()

    @cached_property
    def decode_mask(self) -> torch.Tensor:
        """``[num_decode, 1, 1, W' * block_tokens]``: each decode's valid positions."""
        length = self.decode_tables.shape[1] * self.block_tokens
        positions = torch.arange(length, device=self.block_tables.device)
        valid = positions.unsqueeze(0) < self.context_lens[: self.num_decode].unsqueeze(1)
        return valid[:, None, None, :]


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
    q: torch.Tensor, kv: torch.Tensor, mask: torch.Tensor, scale: float, kernel: DecodeKernel
) -> torch.Tensor:
    """One query per sequence: ``q`` ``[B, Hq, D]``, ``kv`` ``[2, B, Hkv, L, D]``, ``mask``
    ``[B, 1, 1, L]`` (True: attend). Returns ``[B, Hq, D]``.

    The queries are grouped by KV head (``[B, Hkv, Hq / Hkv, D]``), so both kernels see
    equal head counts: ``"matmul"`` runs plain matmuls, ``"sdpa"`` one
    ``scaled_dot_product_attention`` with the boolean mask. Grouping rather than
    ``enable_gqa`` keeps CUDA's memory-efficient kernel eligible (torch's GQA support is
    flash, which takes no mask, or the unfused math kernel).
    """
    b, hq, d = q.shape
    hkv = kv.shape[2]
    qg = q.view(b, hkv, hq // hkv, d)
    if kernel == "sdpa":
        out = F.scaled_dot_product_attention(qg, kv[0], kv[1], attn_mask=mask, scale=scale)
        return out.reshape(b, hq, d)
    scores = (qg @ kv[0].transpose(-1, -2)) * scale  # [B, Hkv, G, L]
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = scores.softmax(dim=-1, dtype=torch.float32).to(q.dtype)
    return (probs @ kv[1]).view(b, hq, d)


def _reference_paged(
    q: torch.Tensor,
    layer_cache: torch.Tensor,
    batch: AttentionBatch,
    scale: float,
    out: torch.Tensor,
) -> None:
    """The pure-torch path for the sequences that read pages: gathers them (two copies)."""
    nd = batch.num_decode
    if nd:
        kv = _gather_pages(layer_cache, batch.decode_tables)
        out[:nd] = _decode_attention(q[:nd], kv, batch.decode_mask, scale, batch.decode_kernel)
    for s in range(nd, batch.num_paged):
        start, end = batch.span(s)
        ctx, n = batch.context_lens_host[s], end - start
        nb = -(-ctx // batch.block_tokens)
        kv = _gather_pages(layer_cache, batch.block_tables[s, :nb].long())[:, :, :ctx]
        q_pos = torch.arange(ctx - n, ctx, device=q.device).unsqueeze(1)
        mask = torch.arange(ctx, device=q.device).unsqueeze(0) <= q_pos  # [n, ctx]
        hq, hkv, d = q.shape[1], kv.shape[1], q.shape[2]
        group = hq // hkv  # queries grouped per KV head, as for the decodes
        qg = q[start:end].view(n, hkv, group, d).permute(1, 2, 0, 3).reshape(hkv, -1, d)
        o = F.scaled_dot_product_attention(
            qg.unsqueeze(0), kv[0].unsqueeze(0), kv[1].unsqueeze(0),
            attn_mask=mask.repeat(group, 1), scale=scale,
        )  # fmt: skip
        out[start:end] = o[0].view(hkv, group, n, d).permute(2, 0, 1, 3).reshape(n, hq, d)


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
    paged = batch.num_paged
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if batch.native:
        if q.stride(-1) != 1:  # the kernel wants unit-stride rows (a skinny product's are not)
            q = q.contiguous()
        native.write_kv(k, v, layer_cache, batch.slot_mapping)
        if paged:
            native.paged_attention(
                out,
                q,
                layer_cache,
                batch.block_tables[:paged],
                batch.context_lens[:paged],
                batch.query_starts[: paged + 1],
                scale,
            )
    else:
        layer_cache[batch.slot_pages, :, batch.slot_offsets] = torch.stack((k, v), dim=1)
        if paged:
            _reference_paged(q, layer_cache, batch, scale, out)
    for s in range(paged, len(batch.query_lens)):
        start, end = batch.span(s)
        o = F.scaled_dot_product_attention(
            q[start:end].transpose(0, 1).unsqueeze(0),
            k[start:end].transpose(0, 1).unsqueeze(0),
            v[start:end].transpose(0, 1).unsqueeze(0),
            is_causal=True,
            scale=scale,
            enable_gqa=True,
        )
        out[start:end] = o[0].transpose(0, 1)
    return out

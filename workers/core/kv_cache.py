"""The paged KV cache: one preallocated slab, one view per layer.

Shape ``[num_layers, num_blocks, 2 (K, V), block_tokens, kv_heads, head_dim]``: every
(layer, block) pair is one contiguous span, which is the unit the KV pool moves (DESIGN.md).
The slab is allocated (and touched) once at start so no step pays page faults.
"""

from __future__ import annotations

import torch

from workers.model.config import ModelConfig


def bytes_per_block(cfg: ModelConfig, block_tokens: int, dtype: torch.dtype) -> int:
    """Bytes of one block across all layers."""
    elem = torch.empty((), dtype=dtype).element_size()
    return cfg.num_layers * 2 * block_tokens * cfg.kv_size * elem


def blocks_for_memory(
    cfg: ModelConfig, block_tokens: int, dtype: torch.dtype, budget_bytes: int
) -> int:
    """How many blocks fit in ``budget_bytes``; raises if not even one does."""
    n = budget_bytes // bytes_per_block(cfg, block_tokens, dtype)
    if n < 1:
        raise ValueError(
            f"KV cache budget of {budget_bytes} bytes holds no block of {block_tokens} tokens; "
            "raise --kv-cache-mib"
        )
    return int(n)


class KVCache:
    """Owns the slab; ``layers[i]`` is layer ``i``'s ``[num_blocks, 2, bt, H, D]`` view."""

    def __init__(
        self,
        cfg: ModelConfig,
        num_blocks: int,
        block_tokens: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.num_blocks = num_blocks
        self.block_tokens = block_tokens
        self.slab = torch.zeros(
            cfg.num_layers,
            num_blocks,
            2,
            block_tokens,
            cfg.num_kv_heads,
            cfg.head_dim,
            dtype=dtype,
            device=device,
        )
        self.layers = list(self.slab.unbind(0))

    @property
    def nbytes(self) -> int:
        return self.slab.numel() * self.slab.element_size()

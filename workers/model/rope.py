"""Rotary position embeddings, with the scaling variants Hugging Face configs name.

The cos/sin tables are computed once in fp32 for every position up to the model length and
looked up by position, so chunked prefill and decode see exactly the values a full-sequence
forward would (the inverse frequencies follow transformers' ``ROPE_INIT_FUNCTIONS``).
"""

from __future__ import annotations

import math

import torch

from workers.model.config import RopeConfig


def inverse_frequencies(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """The fp32 inverse frequencies ``[head_dim // 2]`` for ``rope``."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (rope.theta**exponents)
    if rope.rope_type == "linear":
        return inv_freq / rope.factor
    if rope.rope_type == "llama3":
        return _llama3_scaling(inv_freq, rope)
    return inv_freq


def _llama3_scaling(inv_freq: torch.Tensor, rope: RopeConfig) -> torch.Tensor:
    # Long wavelengths are divided by ``factor``, short ones kept, the band between blended.
    old_len = rope.original_max_position_embeddings
    low_freq_wavelen = old_len / rope.low_freq_factor
    high_freq_wavelen = old_len / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_len / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryTable:
    """cos/sin lookup tables ``[max_positions, head_dim]`` in the model dtype."""

    def __init__(
        self,
        rope: RopeConfig,
        head_dim: int,
        max_positions: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        inv_freq = inverse_frequencies(rope, head_dim)
        positions = torch.arange(max_positions, dtype=torch.float32)
        freqs = torch.outer(positions, inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos = emb.cos().to(dtype=dtype, device=device)
        self.sin = emb.sin().to(dtype=dtype, device=device)
        self.max_positions = max_positions

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin)``, each ``[T, 1, head_dim]``, for a step's ``positions`` ``[T]``.

        Looked up once per step and shared by every layer.
        """
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)


def apply_rotary(
    q: torch.Tensor, k: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate ``q`` ``[T, Hq, D]`` and ``k`` ``[T, Hkv, D]`` by :meth:`RotaryTable.lookup`."""
    cos, sin = cos_sin
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

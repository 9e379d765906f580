"""The Llama-family decoder (Llama 2/3, SmolLM, Qwen2, Qwen3) over a paged KV cache.

The module holds weights only; the KV cache is passed in, one ``[num_blocks, 2, block_tokens,
kv_heads, head_dim]`` tensor per layer. q/k/v and gate/up projections are fused at load
(:mod:`workers.model.loader`) so each layer runs four matmuls.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from workers.model import fused
from workers.model.attention import AttentionBatch, paged_attention
from workers.model.config import ModelConfig
from workers.model.rope import RotaryTable, apply_rotary

CosSin = tuple[torch.Tensor, torch.Tensor]

SKINNY_ROWS = 64
"""Up to this many rows, CPU matmuls without oneDNN run as ``W @ x.T`` (see :class:`Linear`)."""

PACK_ROWS_HINT = 64
"""The row count oneDNN lays packed weights out for (any row count works with them)."""


def _onednn_linear() -> bool:
    """Whether this torch has oneDNN's packed-weight linear (CPU builds with mkldnn)."""
    ops = torch.ops.mkldnn
    return bool(
        torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]
        and hasattr(ops, "_reorder_linear_weight")
        and hasattr(ops, "_linear_pointwise")
    )


ONEDNN_LINEAR = _onednn_linear()


class Linear(nn.Linear):
    """``nn.Linear`` with a faster CPU path.

    - fp32 on CPU with oneDNN: the weight is packed once into oneDNN's blocked layout
      (:data:`PACK_ROWS_HINT`) and every product runs oneDNN's linear on it. Measured on
      these CPUs (one thread, SmolLM2's 49,152 x 512 LM head of the tiny model): 1.6x MKL's
      best at 16 rows, 1.5x at 64, 1.3x at 512 (prefill), equal at 1. The pack is a second
      copy of the weight, made on the first CPU forward and made again whenever the weight
      changes (its storage or its version counter: ``load_state_dict``, ``copy_``).
    - otherwise, with a handful of rows (decode) on CPU, ``(W @ x.T).T``: the product is bound
      by reading the weight, and this measured 1.5-1.9x faster than ``F.linear`` at 16-32
      rows; the result is a transposed view (later ops take any strides);
    - other devices and larger batches use ``F.linear``.
    """

    _pack: torch.Tensor | None = None
    _pack_key: tuple[int, int] = (0, -1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu":
            return F.linear(x, self.weight, self.bias)
        if ONEDNN_LINEAR and x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            return torch.ops.mkldnn._linear_pointwise(  # type: ignore[no-any-return]
                x.contiguous(), self._packed(), self.bias, "none", [], ""
            )
        if x.shape[0] > SKINNY_ROWS:
            return F.linear(x, self.weight, self.bias)
        out = torch.mm(self.weight, x.t()).t()
        return out if self.bias is None else out + self.bias

    def _packed(self) -> torch.Tensor:
        key = (self.weight.data_ptr(), self.weight._version)
        if self._pack is None or key != self._pack_key:
            with torch.no_grad():
                self._pack = torch.ops.mkldnn._reorder_linear_weight(
                    self.weight.detach(), PACK_ROWS_HINT
                )
            self._pack_key = key
        return self._pack


class RMSNorm(nn.Module):
    """RMS normalisation computed in fp32, then scaled in the input dtype, as transformers'
    ``LlamaRMSNorm`` does."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.rms_norm(x.float(), (x.shape[-1],), None, self.eps)
        return self.weight * h.to(x.dtype)

    def fused_forward(self, x: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` of ``[T, n]`` rows in one C++ pass (:mod:`workers.model.fused`)."""
        return fused.rms_norm(x, self.weight, self.eps)

    def add_fused_(self, x: torch.Tensor, residual: torch.Tensor) -> None:
        """In place, in one C++ pass: ``residual += x``, then ``x = self(residual)``."""
        fused.add_rms_norm_(x, residual, self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.qkv_proj = Linear(cfg.hidden_size, cfg.q_size + 2 * cfg.kv_size, cfg.qkv_bias)
        self.o_proj = Linear(cfg.q_size, cfg.hidden_size, cfg.o_bias)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.scale = cfg.head_dim**-0.5

    def forward(
        self,
        x: torch.Tensor,
        cos_sin: CosSin,
        layer_cache: torch.Tensor,
        batch: AttentionBatch,
    ) -> torch.Tensor:
        cfg = self.cfg
        q, k, v = self.qkv_proj(x).split([cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1)
        q = q.view(-1, cfg.num_heads, cfg.head_dim)
        k = k.view(-1, cfg.num_kv_heads, cfg.head_dim)
        v = v.view(-1, cfg.num_kv_heads, cfg.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if batch.native and fused.usable(q):
            fused.rotary_(q, k, cos_sin)
        else:
            q, k = apply_rotary(q, k, cos_sin)
        o = paged_attention(q, k, v, layer_cache, batch, self.scale)
        out: torch.Tensor = self.o_proj(o.reshape(-1, cfg.q_size))
        return out


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = Linear(cfg.hidden_size, 2 * cfg.intermediate_size, cfg.mlp_bias)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, cfg.mlp_bias)

    def forward(self, x: torch.Tensor, fuse: bool = False) -> torch.Tensor:
        """``fuse``: SiLU-and-mul in one C++ pass (float32 CPU activations only)."""
        gate_up = self.gate_up_proj(x)
        if fuse:
            act = fused.silu_and_mul(gate_up.contiguous())
        else:
            gate, up = gate_up.chunk(2, dim=-1)
            act = F.silu(gate) * up
        out: torch.Tensor = self.down_proj(act)
        return out


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(
        self,
        x: torch.Tensor,
        cos_sin: CosSin,
        layer_cache: torch.Tensor,
        batch: AttentionBatch,
    ) -> torch.Tensor:
        """The layer's output; with the native kernels and float32 activations, ``x`` itself,
        updated in place (the caller owns it: the embedding's output or the last layer's)."""
        if batch.native and fused.usable(x):
            h = self.self_attn(self.input_layernorm.fused_forward(x), cos_sin, layer_cache, batch)
            h = h.contiguous()
            self.post_attention_layernorm.add_fused_(h, x)
            return x.add_(self.mlp(h, fuse=True))
        x = x + self.self_attn(self.input_layernorm(x), cos_sin, layer_cache, batch)
        out: torch.Tensor = x + self.mlp(self.post_attention_layernorm(x))
        return out


class LlamaModel(nn.Module):
    """Decoder stack and LM head. Construct on the meta device, then give it the
    checkpoint's tensors (:func:`workers.model.loader.load_model`): no parameter is
    initialised here."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        # The embedding gets its (uninitialised) weight: its default init, normal_ on the
        # meta device, imports torch._dynamo, seconds of CPU at every worker's start.
        table = torch.empty(cfg.vocab_size, cfg.hidden_size)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, _weight=table)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.tie_weights()

    def tie_weights(self) -> None:
        """Make the LM head share the embedding's Parameter when the config ties them (again
        after anything that replaces parameters, such as ``to_empty``)."""
        if self.cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        rope: RotaryTable,
        kv_cache: list[torch.Tensor],
        batch: AttentionBatch,
        on_layer: Callable[[int], None] | None = None,
    ) -> torch.Tensor:
        """Hidden states ``[T, hidden]`` after the final norm, for the flattened batch.

        ``on_layer(i)`` is called once layer ``i``'s KV is in the cache (KV streaming).
        """
        x = self.embed_tokens(input_ids)
        cos_sin = rope.lookup(positions)
        for i, (layer, layer_cache) in enumerate(zip(self.layers, kv_cache, strict=True)):
            x = layer(x, cos_sin, layer_cache, batch)
            if on_layer is not None:  # no sync: a copy out of a GPU waits on an event
                on_layer(i)  # recorded by on_layer (workers/handoff/staging.py)
        if batch.native and fused.usable(x):
            return self.norm.fused_forward(x)
        return self.norm(x)  # type: ignore[no-any-return]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits ``[N, vocab]``, row-major, for the selected hidden rows (the skinny
        product comes out transposed; a vocabulary-wide argmax over it is several times
        slower)."""
        return self.lm_head(hidden).float().contiguous()  # type: ignore[no-any-return]

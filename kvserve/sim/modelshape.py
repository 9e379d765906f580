"""The shape of a Llama-family decoder: parameter count, FLOPs and KV bytes per token.

Counting rules (Llama / Qwen-style blocks, no biases):

- per layer: attention q ``hidden x heads*head_dim``, k and v ``hidden x kv_heads*head_dim``
  each, o ``heads*head_dim x hidden``; gated MLP gate, up ``hidden x intermediate`` and down
  ``intermediate x hidden``; two RMSNorm weights of ``hidden``;
- once: the final norm (``hidden``), the embedding ``vocab x hidden`` and, unless tied, an
  lm head of the same size.

FLOPs count a multiply-add as 2. A token's linear FLOPs are ``2 x`` every weight it is
multiplied by: all layer weights plus the lm head; the embedding lookup is a gather, not a
matmul (with tied embeddings the shared matrix is counted once, as the lm head).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ModelShape:
    """The dimensions of one model; ``head_dim`` is usually ``hidden // heads``."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool = False

    def __post_init__(self) -> None:
        for field in ("layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate"):
            value = getattr(self, field)
            if value < 1:
                raise ValueError(f"model {self.name!r}: {field} must be >= 1, got {value}")
        if self.vocab < 1:
            raise ValueError(f"model {self.name!r}: vocab must be >= 1, got {self.vocab}")
        if self.heads % self.kv_heads:
            raise ValueError(
                f"model {self.name!r}: heads ({self.heads}) must be a multiple of kv_heads "
                f"({self.kv_heads}) for grouped-query attention"
            )

    @property
    def layer_params(self) -> int:
        """Weights of one decoder layer (attention, gated MLP, two norms)."""
        q = self.heads * self.head_dim
        kv = self.kv_heads * self.head_dim
        attention = self.hidden * q + 2 * self.hidden * kv + q * self.hidden
        return attention + 3 * self.hidden * self.intermediate + 2 * self.hidden

    @property
    def embedding_params(self) -> int:
        """One ``vocab x hidden`` matrix (the embedding, or the lm head)."""
        return self.vocab * self.hidden

    @property
    def params(self) -> int:
        """Every weight: layers, final norm, embedding and (if untied) the lm head."""
        heads = 1 if self.tied_embeddings else 2
        return self.layers * self.layer_params + self.hidden + heads * self.embedding_params

    @property
    def matmul_params(self) -> int:
        """Weights a token is multiplied by: all but the embedding lookup (the lm head
        stays). These are also the bytes one forward step reads, in elements."""
        return self.layers * self.layer_params + self.hidden + self.embedding_params

    @property
    def flops_per_token(self) -> int:
        """Linear FLOPs of one token through the whole model, lm head included."""
        return 2 * self.matmul_params

    @property
    def layer_flops_per_token(self) -> int:
        """Linear FLOPs of one token through all decoder layers (no lm head)."""
        return 2 * self.layers * self.layer_params

    @property
    def lm_head_flops(self) -> int:
        """FLOPs of one token's logits."""
        return 2 * self.embedding_params

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """KV cache bytes of one token: K and V, every layer, ``kv_heads x head_dim``."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes

    def attention_flops(self, new_tokens: int, context: int) -> float:
        """FLOPs of QK^T and PV for ``new_tokens`` appended after ``context`` cached tokens,
        causal: new token ``i`` (1-based) attends to ``context + i`` keys, 2 FLOPs per
        element for each of the two products, every query head, every layer."""
        keys = new_tokens * context + new_tokens * (new_tokens + 1) / 2
        return 4.0 * self.layers * self.heads * self.head_dim * keys


PRESETS: dict[str, ModelShape] = {
    # HuggingFaceTB/SmolLM2-135M(-Instruct) config.json
    "smollm2-135m": ModelShape("smollm2-135m", 30, 576, 9, 3, 64, 1536, 49152, True),
    # meta-llama/Meta-Llama-3-8B config.json
    "llama3-8b": ModelShape("llama3-8b", 32, 4096, 32, 8, 128, 14336, 128256, False),
    # meta-llama/Meta-Llama-3-70B config.json
    "llama3-70b": ModelShape("llama3-70b", 80, 8192, 64, 8, 128, 28672, 128256, False),
}

_REQUIRED = (
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "intermediate_size",
    "vocab_size",
)


def from_hf_config(config: dict[str, Any], name: str = "hf-config") -> ModelShape:
    """The shape described by a Hugging Face ``config.json`` (Llama keys). Optional keys:
    ``num_key_value_heads`` (default: no GQA), ``head_dim`` (default ``hidden / heads``),
    ``tie_word_embeddings`` (default false, as in ``LlamaConfig``)."""
    missing = [key for key in _REQUIRED if key not in config]
    if missing:
        raise ValueError(f"model config {name!r} lacks {', '.join(missing)}")
    heads = int(config["num_attention_heads"])
    hidden = int(config["hidden_size"])
    head_dim = config.get("head_dim")
    return ModelShape(
        name=name,
        layers=int(config["num_hidden_layers"]),
        hidden=hidden,
        heads=heads,
        kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(head_dim) if head_dim else hidden // heads,
        intermediate=int(config["intermediate_size"]),
        vocab=int(config["vocab_size"]),
        tied_embeddings=bool(config.get("tie_word_embeddings", False)),
    )


def load_shape(name_or_dir: str) -> ModelShape:
    """A preset by name (case-insensitive), or the ``config.json`` of a model directory."""
    preset = PRESETS.get(name_or_dir.lower())
    if preset is not None:
        return preset
    config = Path(name_or_dir).expanduser() / "config.json"
    if not config.is_file():
        raise ValueError(
            f"model {name_or_dir!r} is neither a preset ({', '.join(sorted(PRESETS))}) "
            "nor a directory holding config.json"
        )
    return from_hf_config(json.loads(config.read_text()), name=config.parent.name)

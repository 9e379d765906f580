"""Model architecture read from a Hugging Face ``config.json``.

Supported families: Llama 2/3 (and SmolLM, which is Llama), Qwen2 (bias on q/k/v) and Qwen3
(RMSNorm on q and k per head). Anything else is refused at load with a message naming the
field that does not fit, never silently run with the wrong math.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SUPPORTED_TYPES = ("llama", "qwen2", "qwen3")
SUPPORTED_ROPE = ("default", "linear", "llama3")


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding parameters (``rope_type`` as Hugging Face names it)."""

    theta: float = 10000.0
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self) -> None:
        if self.rope_type not in SUPPORTED_ROPE:
            raise ValueError(
                f"rope_type {self.rope_type!r} is not supported (supported: {SUPPORTED_ROPE})"
            )


@dataclass(frozen=True)
class ModelConfig:
    """The architecture numbers the engine needs; built by :func:`load_model_config`."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    rope: RopeConfig = field(default_factory=RopeConfig)
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_kv_heads})"
            )

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim


def _rope_from_hf(raw: dict[str, Any]) -> RopeConfig:
    # transformers >= 5 writes ``rope_parameters``; older configs ``rope_theta`` + ``rope_scaling``.
    params = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    rope_type = str(params.get("rope_type", params.get("type", "default")))
    return RopeConfig(
        theta=theta,
        rope_type=rope_type,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(
            params.get("original_max_position_embeddings", raw.get("max_position_embeddings", 8192))
        ),
    )


def _eos_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, list):
        return tuple(int(v) for v in value)
    return (int(value),)


def model_config_from_dict(raw: dict[str, Any]) -> ModelConfig:
    """Validate and convert a parsed ``config.json``."""
    model_type = raw.get("model_type", "")
    if model_type not in SUPPORTED_TYPES:
        raise ValueError(
            f"model_type {model_type!r} is not supported (supported: {SUPPORTED_TYPES})"
        )
    if raw.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act {raw['hidden_act']!r} is not supported (only 'silu')")
    if raw.get("use_sliding_window"):
        raise ValueError("sliding-window attention is not supported")
    heads = int(raw["num_attention_heads"])
    hidden = int(raw["hidden_size"])
    attention_bias = bool(raw.get("attention_bias", False))
    return ModelConfig(
        model_type=model_type,
        vocab_size=int(raw["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(raw["intermediate_size"]),
        num_layers=int(raw["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=int(raw.get("head_dim") or hidden // heads),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        qkv_bias=model_type == "qwen2" or attention_bias,
        o_bias=model_type != "qwen2" and attention_bias,
        mlp_bias=bool(raw.get("mlp_bias", False)),
        qk_norm=model_type == "qwen3",
        rope=_rope_from_hf(raw),
        eos_token_ids=_eos_ids(raw.get("eos_token_id")),
        bos_token_id=raw.get("bos_token_id"),
    )


def load_model_config(model_dir: Path) -> ModelConfig:
    """Read ``model_dir/config.json``; raises ``FileNotFoundError`` with the path if absent."""
    path = model_dir / "config.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"no config.json in {model_dir}: not a Hugging Face model directory"
        )
    return model_config_from_dict(json.loads(path.read_text()))

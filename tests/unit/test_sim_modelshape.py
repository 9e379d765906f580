"""Model shapes: exact parameter counts, KV bytes, FLOPs, Hugging Face configs, presets."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from kvserve.sim.modelshape import PRESETS, ModelShape, from_hf_config, load_shape

# Copied from ~/.cache/kvserve/models/SmolLM2-135M-Instruct/config.json (the keys we read).
SMOLLM2_CONFIG: dict[str, Any] = {
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "tie_word_embeddings": True,
    "head_dim": 64,
    "model_type": "llama",
}

# The tiny test model `kvserve make-model` writes (~/.cache/kvserve/models/tiny-llama).
TINY_CONFIG: dict[str, Any] = {
    "head_dim": 32,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_attention_heads": 4,
    "num_hidden_layers": 4,
    "num_key_value_heads": 2,
    "tie_word_embeddings": False,
    "vocab_size": 49152,
}


def test_param_counts_match_the_published_sizes_exactly() -> None:
    # Known exact sizes: Llama 3 8B 8,030,261,248; 70B 70,553,706,496; SmolLM2 134,515,008.
    assert PRESETS["llama3-8b"].params == 8_030_261_248
    assert PRESETS["llama3-70b"].params == 70_553_706_496
    assert PRESETS["smollm2-135m"].params == 134_515_008
    assert PRESETS["llama3-8b"].params == pytest.approx(8.03e9, rel=0.01)
    assert PRESETS["smollm2-135m"].params == pytest.approx(134.5e6, rel=0.01)


def test_layer_params_by_hand() -> None:
    m = PRESETS["llama3-8b"]
    q_o = 2 * 4096 * 4096
    k_v = 2 * 4096 * 8 * 128
    assert m.layer_params == q_o + k_v + 3 * 4096 * 14336 + 2 * 4096


def test_kv_bytes_per_token() -> None:
    assert PRESETS["llama3-8b"].kv_bytes_per_token(2) == 2 * 32 * 8 * 128 * 2 == 131072
    assert PRESETS["smollm2-135m"].kv_bytes_per_token(4) == 2 * 30 * 3 * 64 * 4


def test_flops_per_token_excludes_only_the_embedding_lookup() -> None:
    untied = PRESETS["llama3-8b"]
    assert untied.flops_per_token == 2 * (untied.params - untied.vocab * untied.hidden)
    tied = PRESETS["smollm2-135m"]  # the shared matrix is the lm head
    assert tied.flops_per_token == 2 * tied.params
    assert untied.flops_per_token == untied.layer_flops_per_token + untied.lm_head_flops + 8192


def test_attention_flops_causal_sum() -> None:
    m = ModelShape(
        "t", layers=2, hidden=8, heads=2, kv_heads=1, head_dim=4, intermediate=8, vocab=5
    )
    per_key = 4 * 2 * 2 * 4  # 2 products x 2 FLOPs, heads x head_dim, layers
    assert m.attention_flops(1, 0) == per_key * 1
    assert m.attention_flops(1, 10) == per_key * 11
    assert m.attention_flops(3, 5) == per_key * (6 + 7 + 8)


def test_from_hf_config_matches_the_presets() -> None:
    assert from_hf_config(SMOLLM2_CONFIG, name="smollm2-135m") == PRESETS["smollm2-135m"]
    tiny = from_hf_config(TINY_CONFIG, name="tiny")
    assert (tiny.layers, tiny.heads, tiny.kv_heads, tiny.head_dim) == (4, 4, 2, 32)
    assert not tiny.tied_embeddings


def test_from_hf_config_defaults_and_missing_keys() -> None:
    bare = {k: v for k, v in SMOLLM2_CONFIG.items() if k not in ("head_dim", "num_key_value_heads")}
    shape = from_hf_config(bare)
    assert (shape.head_dim, shape.kv_heads) == (576 // 9, 9)
    with pytest.raises(ValueError, match="lacks hidden_size, vocab_size"):
        from_hf_config({k: v for k, v in bare.items() if k not in ("hidden_size", "vocab_size")})


def test_load_shape_preset_or_directory(tmp_path: Path) -> None:
    assert load_shape("LLAMA3-8B") is PRESETS["llama3-8b"]
    (tmp_path / "config.json").write_text(json.dumps(TINY_CONFIG))
    assert load_shape(str(tmp_path)) == from_hf_config(TINY_CONFIG, name=tmp_path.name)
    with pytest.raises(ValueError, match=r"neither a preset \(llama3-70b, llama3-8b"):
        load_shape(str(tmp_path / "absent"))


def test_shape_validation() -> None:
    base = PRESETS["llama3-8b"]
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        dataclasses.replace(base, kv_heads=5)
    with pytest.raises(ValueError, match="layers must be >= 1"):
        dataclasses.replace(base, layers=0)

from __future__ import annotations

import argparse
import math

import pytest
import torch

from kvserve.settings import add_config_args, config_from_args
from workers.config import EngineConfig
from workers.model.config import RopeConfig, model_config_from_dict
from workers.model.rope import inverse_frequencies

LLAMA = {
    "model_type": "llama",
    "vocab_size": 100,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rope_theta": 500000.0,
    "eos_token_id": [1, 2],
    "tie_word_embeddings": True,
}


def test_engine_config_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="dtype"):
        EngineConfig(dtype="int8")
    with pytest.raises(ValueError, match="device"):
        EngineConfig(device="tpu")
    with pytest.raises(ValueError, match="block_tokens"):
        EngineConfig(block_tokens=0)


def test_a_prompts_last_push_waits_for_its_token_where_it_shares_the_cores() -> None:
    assert EngineConfig().push_after_token  # auto, on the CPU
    assert not EngineConfig(device="cuda").push_after_token  # auto, on a GPU
    assert EngineConfig(device="cuda", kv_push_timing="after_token").push_after_token
    assert not EngineConfig(kv_push_timing="layerwise").push_after_token
    with pytest.raises(ValueError, match="kv_push_timing"):
        EngineConfig(kv_push_timing="later")


def test_settings_flags_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVSERVE_KV_CACHE_MIB", "77")
    monkeypatch.setenv("KVSERVE_PREFIX_CACHING", "false")
    parser = argparse.ArgumentParser()
    add_config_args(parser, EngineConfig)
    cfg = config_from_args(EngineConfig, parser.parse_args(["--block-tokens", "16"]))
    assert (cfg.kv_cache_mib, cfg.prefix_caching, cfg.block_tokens) == (77, False, 16)
    flag = config_from_args(EngineConfig, parser.parse_args(["--kv-cache-mib", "5"]))
    assert flag.kv_cache_mib == 5  # a flag beats the environment


def test_llama_config_fields() -> None:
    cfg = model_config_from_dict(LLAMA)
    assert (cfg.head_dim, cfg.num_kv_heads, cfg.eos_token_ids) == (16, 2, (1, 2))
    assert not cfg.qkv_bias and not cfg.qk_norm and cfg.tie_word_embeddings
    assert cfg.rope.theta == 500000.0


def test_qwen_switches() -> None:
    q2 = model_config_from_dict({**LLAMA, "model_type": "qwen2"})
    assert q2.qkv_bias and not q2.o_bias and not q2.qk_norm
    q3 = model_config_from_dict({**LLAMA, "model_type": "qwen3", "head_dim": 32})
    assert q3.qk_norm and not q3.qkv_bias and q3.head_dim == 32


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({**LLAMA, "model_type": "gpt2"}, "model_type"),
        ({**LLAMA, "hidden_act": "gelu"}, "hidden_act"),
        ({**LLAMA, "num_key_value_heads": 3}, "multiple"),
        ({**LLAMA, "rope_scaling": {"rope_type": "yarn", "factor": 2.0}}, "rope_type"),
    ],
)
def test_unsupported_models_are_refused(raw: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        model_config_from_dict(raw)


@pytest.mark.parametrize(
    "scaling",
    [
        None,
        {"rope_type": "linear", "factor": 4.0},
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ],
)
def test_rope_frequencies_match_transformers(scaling: dict[str, object] | None) -> None:
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params: dict[str, object] = {"rope_theta": 500000.0, "rope_type": "default"}
    params.update(scaling or {})
    hf = LlamaConfig(hidden_size=64, num_attention_heads=4, rope_parameters=params)
    kind = str(params["rope_type"])
    fn = ROPE_INIT_FUNCTIONS[kind] if kind != "default" else None
    if fn is None:
        expected = 1.0 / (500000.0 ** (torch.arange(0, 16, 2).float() / 16))
    else:
        expected, _ = fn(hf, "cpu")
    ours = inverse_frequencies(
        model_config_from_dict({**LLAMA, "rope_parameters": params}).rope, 16
    )
    torch.testing.assert_close(ours, expected)


def test_rope_default_is_plain() -> None:
    inv = inverse_frequencies(RopeConfig(theta=10000.0), 4)
    assert inv.tolist() == pytest.approx([1.0, 1.0 / math.sqrt(10000.0)])

"""Load a Hugging Face checkpoint directory into :class:`LlamaModel`, offline.

Reads ``model.safetensors`` or the shards named by ``model.safetensors.index.json``, maps the
Hugging Face tensor names onto ours (fusing q/k/v and gate/up), and refuses a checkpoint with
missing or unexpected tensors, naming them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
import xxhash
from safetensors import safe_open

from workers.model.config import ModelConfig, load_model_config
from workers.model.llama import LlamaModel

_FUSED = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}


def safetensors_files(model_dir: Path) -> list[Path]:
    """The weight files of ``model_dir``, single or sharded, in a stable order."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [model_dir / s for s in shards]
    single = model_dir / "model.safetensors"
    if single.is_file():
        return [single]
    raise FileNotFoundError(f"no model.safetensors (or index) in {model_dir}")


def _read_tensors(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                yield name, f.get_tensor(name)


def _hf_to_ours(raw: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    consumed: set[str] = set()
    for name in raw:
        stem = name.removeprefix("model.")
        for fused, parts in _FUSED.items():
            for suffix in ("weight", "bias"):
                first = f".{parts[0]}.{suffix}"
                if not stem.endswith(first):
                    continue
                prefix = name[: -len(first)]
                names = [f"{prefix}.{p}.{suffix}" for p in parts]
                missing = [n for n in names if n not in raw]
                if missing:
                    raise ValueError(f"checkpoint lacks {missing}")
                out[f"{prefix.removeprefix('model.')}.{fused}.{suffix}"] = torch.cat(
                    [raw[n] for n in names]
                )
                consumed.update(names)
    for name, tensor in raw.items():
        if name not in consumed:
            out[name.removeprefix("model.")] = tensor
    return out


def model_fingerprint(model_dir: Path) -> str:
    """A short content hash of the config and weights: the model part of the KV namespace."""
    h = xxhash.xxh3_64()
    h.update((model_dir / "config.json").read_bytes())
    for path in safetensors_files(model_dir):
        with path.open("rb") as f:
            while chunk := f.read(16 << 20):
                h.update(chunk)
    return h.hexdigest()


def load_model(
    model_dir: Path, dtype: torch.dtype, device: torch.device
) -> tuple[LlamaModel, ModelConfig]:
    """Build the model on ``device`` in ``dtype`` and load the checkpoint into it.

    The modules are built on the meta device (no memory, no random initialisation), then
    each parameter is replaced by its checkpoint tensor, copied to ``device`` in ``dtype``
    (a missing one is refused): no fp32 copy of the weights ever exists there (twice a
    bf16 model's size), and no meta tensor is operated on (meta ops go through torch's
    Python references, whose first use imports sympy: seconds at every worker's start)."""
    cfg = load_model_config(model_dir)
    state = _hf_to_ours(dict(_read_tensors(safetensors_files(model_dir))))
    if cfg.tie_word_embeddings:
        # Deduplicating writers may keep either name of the shared tensor.
        head = state.pop("lm_head.weight", None)
        if "embed_tokens.weight" not in state and head is not None:
            state["embed_tokens.weight"] = head
    with torch.device("meta"):
        model = LlamaModel(cfg)
    expected = set(model.state_dict())
    if cfg.tie_word_embeddings:
        expected.discard("lm_head.weight")
    missing, unexpected = expected - state.keys(), state.keys() - expected
    unexpected = {n for n in unexpected if "rotary_emb" not in n}
    if missing or unexpected:
        raise ValueError(
            f"checkpoint in {model_dir} does not fit {cfg.model_type}: "
            f"missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}"
        )
    placed = {n: state[n].to(device=device, dtype=dtype, copy=True) for n in expected}
    model.load_state_dict(placed, strict=False, assign=True)
    model.tie_weights()  # the head takes the embedding's new Parameter
    model.eval()
    return model, cfg

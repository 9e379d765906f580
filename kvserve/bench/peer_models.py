"""The models of ``kvserve bench peer``: names to local Hugging Face directories, and shapes.

- ``default``: SmolLM2-135M-Instruct, converted once, offline, into the model cache
  (:func:`workers.model.prepare.prepare_default_model`, as every other command does);
- ``tiny``: the project's random-weight Llama (:func:`~workers.model.prepare.make_tiny_model`)
  in the shape of the issue's 32M-parameter comparison model, 8 layers, hidden 512, 8 heads
  / 4 KV heads, fp32, made once under ``<cache>/models/``. ``make_tiny_model`` takes its
  vocabulary from the tokenizer it copies (SmolLM2's 49,152 tokens, not 8,000), so the
  model has about 69M parameters, most of them in its embeddings: :func:`model_shape`
  records the real shape in the conditions;
- anything else: a path to a local HF directory (``config.json``, safetensors,
  ``tokenizer.json``).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

TINY_SHAPE = {"layers": 8, "hidden": 512, "heads": 8, "kv_heads": 4}
TINY_NAME = "tiny-llama-8x512"


def tiny_model_dir() -> Path:
    from workers.model.prepare import cache_dir

    return cache_dir() / "models" / TINY_NAME


def resolve_model(spec: str) -> Path:
    """``default``, ``tiny`` or a directory -> an existing model directory (made or
    converted on first use). FileNotFoundError for a directory without ``config.json``."""
    from workers.model import prepare

    if spec == "default":
        return prepare.prepare_default_model()
    if spec == "tiny":
        target = tiny_model_dir()
        if (target / "config.json").is_file():
            return target
        shape = TINY_SHAPE
        return prepare.make_tiny_model(
            target,
            seed=0,
            arch="llama",
            layers=shape["layers"],
            hidden=shape["hidden"],
            heads=shape["heads"],
            kv_heads=shape["kv_heads"],
        )
    path = Path(spec).expanduser().resolve()
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"--model {spec}: no config.json there (default, tiny or a dir)")
    return path


def safetensors_parameters(model_dir: Path) -> int | None:
    """The number of weights in ``model_dir``'s ``*.safetensors`` files, read from their
    headers only (None if there are none or one is unreadable)."""
    total, files = 0, sorted(model_dir.glob("*.safetensors"))
    for path in files:
        try:
            with path.open("rb") as f:
                (size,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(size))
        except (OSError, ValueError, struct.error):
            return None
        for name, entry in header.items():
            if name != "__metadata__":
                count = 1
                for dim in entry["shape"]:
                    count *= int(dim)
                total += count
    return total if files else None


def model_shape(model_dir: Path) -> dict[str, Any]:
    """What the conditions say about a model: its directory, architecture and shape from
    ``config.json``, and its parameter count from the safetensors headers."""
    config = json.loads((model_dir / "config.json").read_text())
    return {
        "dir": str(model_dir),
        "name": model_dir.name,
        "architecture": (config.get("architectures") or [config.get("model_type")])[0],
        "layers": config.get("num_hidden_layers"),
        "hidden": config.get("hidden_size"),
        "intermediate": config.get("intermediate_size"),
        "heads": config.get("num_attention_heads"),
        "kv_heads": config.get("num_key_value_heads"),
        "vocab": config.get("vocab_size"),
        "tied_embeddings": config.get("tie_word_embeddings"),
        "dtype": config.get("dtype") or config.get("torch_dtype"),
        "parameters": safetensors_parameters(model_dir),
    }

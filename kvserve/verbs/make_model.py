"""``kvserve make-model``: write a deterministic tiny random-weight model (for tests)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal


@dataclass(frozen=True)
class MakeModelConfig:
    """The tiny model ``kvserve make-model`` writes.

    - ``out``: the model directory to write;
    - ``seed``: seed of the random weights;
    - ``arch``: the architecture of the model's config;
    - ``layers`` / ``hidden`` / ``heads`` / ``kv_heads``: decoder layers, hidden size,
      attention heads and key/value heads;
    - ``tokenizer_from``: model directory to copy the tokenizer from (default: SmolLM2).
    """

    env_prefix: ClassVar[str] = "KVSERVE_MAKE_MODEL_"
    out: str
    seed: int = 0
    arch: Literal["llama", "qwen2", "qwen3"] = "llama"
    layers: int = 4
    hidden: int = 128
    heads: int = 4
    kv_heads: int = 2
    tokenizer_from: str = ""


SETTINGS = (MakeModelConfig,)


def run(args: argparse.Namespace) -> int:
    """Write the model and print its directory."""
    from workers.model.prepare import make_tiny_model

    path = make_tiny_model(
        Path(args.out),
        seed=args.seed,
        arch=args.arch,
        layers=args.layers,
        hidden=args.hidden,
        heads=args.heads,
        kv_heads=args.kv_heads,
        tokenizer_dir=Path(args.tokenizer_from) if args.tokenizer_from else None,
    )
    print(path)
    return 0

"""``kvserve prepare-model``: convert the shipped SmolLM2-135M-Instruct GGUF into a Hugging
Face directory (offline)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar


@dataclass(frozen=True)
class PrepareModelConfig:
    """Where ``kvserve prepare-model`` writes.

    - ``out``: target directory (default: the model cache);
    - ``force``: convert again even if present.
    """

    env_prefix: ClassVar[str] = "KVSERVE_PREPARE_MODEL_"
    out: str = ""
    force: bool = False


SETTINGS = (PrepareModelConfig,)


def run(args: argparse.Namespace) -> int:
    """Convert (unless present) and print the model directory."""
    from workers.model.prepare import prepare_default_model

    print(prepare_default_model(Path(args.out) if args.out else None, force=args.force))
    return 0

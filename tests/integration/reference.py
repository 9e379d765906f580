"""Hugging Face ``transformers`` as the reference implementation for token exactness."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import torch

from kvserve.gpucheck import reference


@cache
def hf_model(model_dir: Path) -> Any:
    """The fp32 CPU reference of ``model_dir``, loaded once."""
    return reference.hf_model(model_dir, torch.float32, "cpu")


def hf_greedy(model_dir: Path, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Greedy continuation of one prompt (batch of one: no padding), EOS ignored."""
    return reference.hf_greedy(hf_model(model_dir), prompt, max_new_tokens)


def hf_last_logits(model_dir: Path, prompt: list[int]) -> torch.Tensor:
    """fp32 logits at the last prompt position."""
    return reference.hf_last_logits(hf_model(model_dir), prompt)


@torch.inference_mode()
def hf_logprobs(model_dir: Path, ids: list[int]) -> torch.Tensor:
    """transformers' log-softmax (fp32) at every position of ``ids`` ``[len, vocab]``."""
    logits = hf_model(model_dir)(torch.tensor([ids])).logits[0].float()
    return logits.log_softmax(dim=-1)  # type: ignore[no-any-return]

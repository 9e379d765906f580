"""Hugging Face ``transformers`` as the reference implementation for token exactness."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import torch


@cache
def hf_model(model_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)


@torch.inference_mode()
def hf_greedy(model_dir: Path, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Greedy continuation of one prompt (batch of one: no padding), EOS ignored."""
    model = hf_model(model_dir)
    ids = torch.tensor([prompt])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new_tokens,
        min_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    return [int(t) for t in out[0, len(prompt) :]]


@torch.inference_mode()
def hf_last_logits(model_dir: Path, prompt: list[int]) -> torch.Tensor:
    """fp32 logits at the last prompt position."""
    return hf_model(model_dir)(torch.tensor([prompt])).logits[0, -1].float()  # type: ignore[no-any-return]


@torch.inference_mode()
def hf_logprobs(model_dir: Path, ids: list[int]) -> torch.Tensor:
    """transformers' log-softmax (fp32) at every position of ``ids`` ``[len, vocab]``."""
    logits = hf_model(model_dir)(torch.tensor([ids])).logits[0].float()
    return logits.log_softmax(dim=-1)  # type: ignore[no-any-return]

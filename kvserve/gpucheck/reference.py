"""Hugging Face ``transformers`` as the reference an engine is checked against (on any
device and dtype; the test suite's reference, ``tests/integration/reference.py``, is this on
the CPU in fp32)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def hf_model(model_dir: Path, dtype: torch.dtype, device: str) -> Any:
    """The ``transformers`` model of ``model_dir`` in ``dtype`` on ``device``, for inference."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype)
    return model.to(device).eval()


@torch.inference_mode()
def hf_greedy(model: Any, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Greedy continuation of one prompt (batch of one: no padding), EOS ignored."""
    ids = torch.tensor([prompt], device=model.device)
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new_tokens,
        min_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    return [int(t) for t in out[0, len(prompt) :].tolist()]


@torch.inference_mode()
def hf_last_logits(model: Any, prompt: list[int]) -> torch.Tensor:
    """fp32 logits at the last prompt position (on the host)."""
    ids = torch.tensor([prompt], device=model.device)
    return model(ids).logits[0, -1].float().cpu()  # type: ignore[no-any-return]

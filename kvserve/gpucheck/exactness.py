"""The engine against ``transformers`` on one device (see :mod:`kvserve.gpucheck`).

Each check returns its figures; it raises :class:`CheckFailedError` (with the figures that show
why) when the engine disagrees with the reference.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch

from kvserve.gpucheck.reference import hf_greedy, hf_last_logits, hf_model
from workers.config import EngineConfig
from workers.core.sequence import SamplingParams
from workers.engine.engine import Engine

LOGIT_TOLERANCE = {"bfloat16": 1.0, "float16": 0.25, "float32": 1e-3}
"""Largest absolute difference of first-token logits (SmolLM2's range is about +-30) allowed
against ``transformers`` in the same dtype: two bf16 implementations round differently."""


class CheckFailedError(AssertionError):
    """A check's result disagrees with its reference; ``figures`` say by how much."""

    def __init__(self, message: str, figures: dict[str, Any]) -> None:
        super().__init__(message)
        self.figures = figures


def _prompts(vocab: int, lengths: tuple[int, ...], seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(n)] for n in lengths]


def _engine(model_dir: Path, device: str, dtype: str) -> Engine:
    config = EngineConfig(
        model=str(model_dir), device=device, dtype=dtype, block_tokens=16, kv_cache_mib=64
    )
    return Engine(config)


def greedy_exact(
    model_dir: Path, device: str, lengths: tuple[int, ...], new_tokens: int
) -> dict[str, Any]:
    """The engine's greedy tokens for prompts of ``lengths`` equal ``transformers``'
    (fp32, batch of one each) token for token."""
    engine = _engine(model_dir, device, "float32")
    try:
        prompts = _prompts(engine.model_config.vocab_size, lengths, seed=1)
        params = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)
        ours = [out.output_token_ids for out in engine.generate(prompts, params)]
        kernel = engine.runner.decode_kernel
    finally:
        engine.close()
    model = hf_model(model_dir, torch.float32, device)
    theirs = [hf_greedy(model, p, new_tokens) for p in prompts]
    differ = [i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b]
    figures = {
        "prompt_tokens": list(lengths),
        "new_tokens": new_tokens,
        "decode_kernel": kernel,
        "sequences_equal": len(prompts) - len(differ),
        "sequences": len(prompts),
    }
    if differ:
        first = differ[0]
        at = next(
            j for j, (a, b) in enumerate(zip(ours[first], theirs[first], strict=True)) if a != b
        )
        figures["first_difference"] = {"sequence": first, "token": at}
        raise CheckFailedError(f"{len(differ)} of {len(prompts)} greedy sequences differ", figures)
    return figures


def first_token_logits(
    model_dir: Path, device: str, dtype: str, length: int, new_tokens: int
) -> dict[str, Any]:
    """The engine's first-token logits in ``dtype`` lie within :data:`LOGIT_TOLERANCE` of
    ``transformers``' in the same dtype, with the same argmax, and the greedy tokens agree."""
    engine = _engine(model_dir, device, dtype)
    try:
        (prompt,) = _prompts(engine.model_config.vocab_size, (length,), seed=2)
        params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
        engine.generate([prompt], params)
        assert engine.runner.last_logits is not None
        ours = engine.runner.last_logits[0].float().cpu()
        params = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)
        (out,) = engine.generate([prompt], params)
    finally:
        engine.close()
    model = hf_model(model_dir, getattr(torch, dtype), device)
    theirs = hf_last_logits(model, prompt)
    tokens = hf_greedy(model, prompt, new_tokens)
    same = next(
        (j for j, (a, b) in enumerate(zip(out.output_token_ids, tokens, strict=True)) if a != b),
        new_tokens,
    )
    diff = round(float((ours - theirs).abs().max()), 5)
    same_argmax = int(ours.argmax()) == int(theirs.argmax())
    figures: dict[str, Any] = {
        "dtype": dtype,
        "prompt_tokens": length,
        "max_abs_logit_diff": diff,
        "tolerance": LOGIT_TOLERANCE[dtype],
        "same_argmax": same_argmax,
        "greedy_tokens_equal": same,
        "greedy_tokens": new_tokens,
    }
    if diff > LOGIT_TOLERANCE[dtype] or not same_argmax:
        raise CheckFailedError("first-token logits differ from transformers'", figures)
    return figures

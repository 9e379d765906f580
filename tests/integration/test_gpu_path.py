"""The engine's CUDA path, exercised on the CPU through the same code.

- The decode kernel is picked from the device (``matmul`` here); forced to ``sdpa`` (what
  CUDA gets) the engine produces the same greedy tokens.
- No per-sequence host reads: on an accelerator every read of a tensor's values on the
  host (``.item()``, ``.tolist()``, ``int(t)``, ``bool(t)``, ``nonzero``, boolean-mask
  indexing...) waits for the device. :class:`HostReads` counts them during each engine
  step; a step of many sequences must read no more often than a step of one of each kind.
  :func:`test_a_per_sequence_item_is_caught` shows that the count catches one ``.item()``
  per sequence.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

from workers.config import EngineConfig
from workers.core.sampling import sample
from workers.core.sequence import SamplingParams
from workers.engine import model_runner
from workers.engine.engine import Engine
from workers.model.attention import DecodeKernel

READS = (
    "item",
    "tolist",
    "numpy",
    "cpu",
    "nonzero",
    "__int__",
    "__float__",
    "__bool__",
    "__index__",
)
"""Tensor methods that bring values to the host (``numpy``: the CPU's ``tolist``)."""

KINDS = [  # one of each kind of request the runner treats differently
    SamplingParams(max_tokens=4, temperature=0, ignore_eos=True),
    SamplingParams(max_tokens=4, temperature=0.8, top_p=0.9, top_k=40, seed=3, logprobs=2),
    SamplingParams(
        max_tokens=4,
        temperature=1.0,
        repetition_penalty=1.3,
        presence_penalty=0.5,
        frequency_penalty=0.2,
        logit_bias={7: 3.0},
        min_tokens=3,
    ),
    SamplingParams(max_tokens=4, temperature=0, ignore_eos=True, prompt_logprobs=2, logprobs=0),
]


class HostReads:
    """Counts host reads of tensor values while :meth:`counting` (see the module docstring)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        self.active = False
        for name in READS:
            monkeypatch.setattr(torch.Tensor, name, self._counted(getattr(torch.Tensor, name)))
        monkeypatch.setattr(torch, "nonzero", self._counted(torch.nonzero))
        for name in ("__getitem__", "__setitem__"):
            original = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, self._counted(original, bool_index=True))

    def _counted(self, fn: Callable[..., Any], bool_index: bool = False) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if self.active and (not bool_index or _bool_index(args[1])):
                self.count += 1
            return fn(*args, **kwargs)

        return wrapper

    @contextmanager
    def counting(self) -> Iterator[None]:
        self.count, self.active = 0, True
        try:
            yield
        finally:
            self.active = False


def _bool_index(index: object) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


def make_engine(model_dir: Path, kernel: DecodeKernel | None = None) -> Engine:
    config = EngineConfig(model=str(model_dir), block_tokens=16, kv_cache_mib=16, attention="torch")
    engine = Engine(config)
    if kernel is not None:
        engine.runner.decode_kernel = kernel
    return engine


def reads_per_step(engine: Engine, copies: int, reads: HostReads) -> list[int]:
    """Add ``copies`` requests of each kind at once, run them out; host reads per step."""
    rng = random.Random(0)
    for _ in range(copies):
        for params in KINDS:
            engine.add_request([rng.randrange(1000) for _ in range(12)], params)
    counts = []
    while engine.has_unfinished:
        with reads.counting():
            engine.step()
        counts.append(reads.count)
    return counts


def test_decode_kernel_comes_from_the_device(tiny_model_dir: Path) -> None:
    assert make_engine(tiny_model_dir).runner.decode_kernel == "matmul"


def test_sdpa_decodes_give_the_same_tokens(tiny_model_dir: Path) -> None:
    rng = random.Random(4)
    prompts = [[rng.randrange(49152) for _ in range(n)] for n in (3, 20, 45)]
    greedy = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    outs = {
        kernel: [
            o.output_token_ids
            for o in make_engine(tiny_model_dir, kernel).generate(prompts, greedy)
        ]
        for kernel in ("matmul", "sdpa")
    }
    assert outs["sdpa"] == outs["matmul"]


@pytest.mark.parametrize("kernel", ["matmul", "sdpa"])
def test_host_reads_do_not_grow_with_the_batch(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, kernel: DecodeKernel
) -> None:
    reads = HostReads(monkeypatch)
    one = reads_per_step(make_engine(tiny_model_dir, kernel), 1, reads)
    many = reads_per_step(make_engine(tiny_model_dir, kernel), 5, reads)
    assert len(one) == len(many) == 4  # a prefill step, then three decode steps
    assert many == one, (one, many)
    assert max(one) <= 8  # the sampled tokens, logprobs: a handful per step


def test_a_per_sequence_item_is_caught(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check above fails for a runner that reads one value per sequence."""

    def leaky(logits: torch.Tensor, *args: Any) -> list[int]:
        for row in range(logits.shape[0]):
            logits[row, 0].item()
        return sample(logits, *args)

    monkeypatch.setattr(model_runner, "sample", leaky)
    reads = HostReads(monkeypatch)
    one = reads_per_step(make_engine(tiny_model_dir), 1, reads)
    many = reads_per_step(make_engine(tiny_model_dir), 5, reads)
    assert all(m >= o + 4 * 4 for o, m in zip(one, many, strict=True)), (one, many)

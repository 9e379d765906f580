"""``kvserve bench engine``: our engine against Hugging Face ``transformers`` on one model.

For each concurrency ``c``, both engines get the same ``c`` random prompts of ``prompt_len``
tokens (equal lengths, so transformers' batched ``generate`` needs no padding: its fairest
case) and run greedy with EOS ignored:

- prefill tokens/s = ``c * prompt_len / t1``, where ``t1`` is the time to produce 1 token;
- decode tokens/s = ``c * (output_len - 1) / (tN - t1)``, where ``tN`` is the time to
  produce ``output_len`` tokens.

Ours and theirs alternate inside every repetition (same threads, same process); each figure
is the median over repetitions, and the ratio is ours / transformers'.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from typing import Any

import torch

from kvserve.bench.report import emit, log, median
from workers.config import EngineConfig
from workers.engine import Engine
from workers.sequence import SamplingParams

Runner = Callable[[list[list[int]], int], None]


def _ours(engine: Engine) -> Runner:
    def run(prompts: list[list[int]], max_tokens: int) -> None:
        params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
        engine.generate(prompts, params)
        engine.scheduler.blocks.pool.reset_prefix_cache()

    return run


def _transformers(model_dir: str, dtype: torch.dtype) -> Runner:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()

    @torch.inference_mode()
    def run(prompts: list[list[int]], max_tokens: int) -> None:
        ids = torch.tensor(prompts)
        model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_tokens,
            min_new_tokens=max_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )

    return run


def _timed(run: Runner, prompts: list[list[int]], max_tokens: int) -> float:
    t0 = time.perf_counter()
    run(prompts, max_tokens)
    return time.perf_counter() - t0


def _measure(run: Runner, prompts: list[list[int]], output_len: int) -> tuple[float, float]:
    t1 = _timed(run, prompts, 1)
    tn = _timed(run, prompts, output_len)
    c, plen = len(prompts), len(prompts[0])
    return c * plen / t1, c * (output_len - 1) / max(tn - t1, 1e-9)


def run_bench(args: argparse.Namespace, config: EngineConfig) -> None:
    engine = Engine(config)
    runners = {
        "kvserve": _ours(engine),
        "transformers": _transformers(str(engine.model_dir), engine.dtype),
    }
    rng = random.Random(args.seed)
    vocab = engine.model_config.vocab_size
    results: list[dict[str, Any]] = []
    for c in args.concurrency:
        prompts = [[rng.randrange(vocab) for _ in range(args.prompt_len)] for _ in range(c)]
        samples: dict[str, list[tuple[float, float]]] = {k: [] for k in runners}
        for name, run in runners.items():  # warm-up, not counted
            run(prompts[:1], 2)
        for rep in range(args.repeat):
            for name, run in runners.items():
                samples[name].append(_measure(run, prompts, args.output_len))
                log(
                    f"c={c} rep={rep} {name}: prefill {samples[name][-1][0]:.0f} tok/s, "
                    f"decode {samples[name][-1][1]:.1f} tok/s"
                )
        row: dict[str, Any] = {"concurrency": c}
        for name, vals in samples.items():
            row[f"{name}_prefill_tok_s"] = round(median([v[0] for v in vals]), 1)
            row[f"{name}_decode_tok_s"] = round(median([v[1] for v in vals]), 1)
        row["prefill_ratio"] = round(
            row["kvserve_prefill_tok_s"] / row["transformers_prefill_tok_s"], 2
        )
        row["decode_ratio"] = round(
            row["kvserve_decode_tok_s"] / row["transformers_decode_tok_s"], 2
        )
        results.append(row)
    head = next((r for r in results if r["concurrency"] == 16), results[-1])
    emit(
        "engine",
        {
            "model": engine.namespace.model,
            "dtype": config.dtype,
            "device": config.device,
            "prompt_len": args.prompt_len,
            "output_len": args.output_len,
            "block_tokens": config.block_tokens,
            "concurrency": args.concurrency,
            "repeat": args.repeat,
            "seed": args.seed,
            "sampling": "greedy, ignore_eos",
            "max_num_batched_tokens": config.max_num_batched_tokens,
            "baseline": "transformers generate, same prompts, batched, no padding",
        },
        results,
        {
            "metric": f"decode tokens/s at concurrency {head['concurrency']}",
            "value": head["kvserve_decode_tok_s"],
            "baseline": head["transformers_decode_tok_s"],
            "ratio": head["decode_ratio"],
            "target": 3.0,
        },
    )

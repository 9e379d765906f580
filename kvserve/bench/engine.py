"""``kvserve bench engine``: our engine against Hugging Face ``transformers`` on one model.

Two workloads at each concurrency ``c``; both engines run greedy with EOS ignored, in the
same process and threads, alternating inside every repetition; figures are medians.

``uniform`` (per-phase speed; transformers' best case): ``c`` random prompts of exactly
``prompt_len`` tokens (so batched ``generate`` needs no padding), each producing exactly
``output_len`` tokens.

- prefill tokens/s = ``c * prompt_len / t1``, ``t1`` the time to produce 1 token;
- decode tokens/s = ``c * (output_len - 1) / (tN - t1)``, ``tN`` the time for ``output_len``.

``serving`` (a request stream): ``serve_factor * c`` requests with prompt lengths uniform in
``[prompt_len / 2, 3 * prompt_len / 2]`` and exponential output lengths of mean
``output_len`` (clipped to ``[2, 4 * output_len]``), at most ``c`` in flight. Ours admits a
new request whenever one finishes (continuous batching); transformers serves them in
arrival-order batches of ``c`` (left-padded, each batch generating until its longest request
is done: static batching). Metric: output tokens/s over the whole run.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

import torch

from kvserve.bench.common import seconds
from kvserve.gpucheck.reference import hf_model
from kvserve.loadgen.workloads import random_tokens
from kvserve.report import emit, log, median
from kvserve.settings import BENCH_ENV, config_from_args, setting
from workers.config import EngineConfig
from workers.core.sequence import SamplingParams
from workers.engine.engine import Engine


@dataclass(frozen=True)
class EngineBenchConfig:
    """The workload of ``kvserve bench engine``.

    - ``concurrency``: requests in flight, one measurement each;
    - ``prompt_len`` / ``output_len``: prompt and output tokens per request;
    - ``repeat``: runs per measurement (the median is reported);
    - ``seed``: seed of the random prompts;
    - ``serve_factor``: serving workload: this many requests per unit of concurrency.
    """

    env_prefix: ClassVar[str] = BENCH_ENV
    concurrency: list[int] = setting([1, 8, 16, 32])
    prompt_len: int = 128
    output_len: int = 64
    repeat: int = 3
    seed: int = 0
    serve_factor: int = 4


SETTINGS = (EngineBenchConfig, EngineConfig)
Request = tuple[list[int], int]  # (prompt ids, output tokens)
Runner = Callable[[list[Request], int], None]  # (requests, max in flight)


def _ours(engine: Engine) -> Runner:
    def serve(requests: list[Request], in_flight: int) -> None:
        pending = list(reversed(requests))
        active = 0
        while pending or active:
            while pending and active < in_flight:
                prompt, n = pending.pop()
                engine.add_request(
                    prompt, SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
                )
                active += 1
            active -= sum(out.finished for out in engine.step())
        engine.scheduler.blocks.pool.reset_prefix_cache()

    return serve


def _transformers(model_dir: str, dtype: torch.dtype, device: torch.device) -> Runner:
    model = hf_model(Path(model_dir), dtype, str(device))

    @torch.inference_mode()
    def serve(requests: list[Request], in_flight: int) -> None:
        for i in range(0, len(requests), in_flight):
            group = requests[i : i + in_flight]
            width = max(len(p) for p, _ in group)
            rows = [[0] * (width - len(p)) + p for p, _ in group]
            masks = [[0] * (width - len(p)) + [1] * len(p) for p, _ in group]
            n = max(m for _, m in group)
            model.generate(
                torch.tensor(rows, device=device),
                attention_mask=torch.tensor(masks, device=device),
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )

    return serve


def _workloads(
    args: argparse.Namespace, c: int, vocab: int, seed: int
) -> tuple[list[list[int]], list[Request]]:
    """The ``uniform`` prompts and the ``serving`` requests at concurrency ``c``."""
    rng = random.Random(seed)
    uniform = [list(random_tokens(rng, args.prompt_len, vocab, low=0)) for _ in range(c)]
    lo, hi = max(1, args.prompt_len // 2), args.prompt_len * 3 // 2
    serving = [
        (
            list(random_tokens(rng, rng.randint(lo, hi), vocab, low=0)),
            min(4 * args.output_len, max(2, round(rng.expovariate(1 / args.output_len)))),
        )
        for _ in range(args.serve_factor * c)
    ]
    return uniform, serving


def _measure(
    serve: Runner, uniform: list[list[int]], serving: list[Request], output_len: int
) -> dict[str, float]:
    c, plen = len(uniform), len(uniform[0])
    t1 = seconds(partial(serve, [(p, 1) for p in uniform], c))
    tn = seconds(partial(serve, [(p, output_len) for p in uniform], c))
    ts = seconds(partial(serve, serving, c))
    return {
        "prefill_tok_s": c * plen / t1,
        "decode_tok_s": c * (output_len - 1) / max(tn - t1, 1e-9),
        "serving_tok_s": sum(n for _, n in serving) / ts,
    }


def run(args: argparse.Namespace) -> int:
    config = config_from_args(EngineConfig, args)
    engine = Engine(config)
    runners = {
        "kvserve": _ours(engine),
        "transformers": _transformers(str(engine.model_dir), engine.dtype, engine.device),
    }
    vocab = engine.model_config.vocab_size
    for serve in runners.values():  # warm-up, not counted
        serve([([1, 2, 3], 2)], 1)
    results: list[dict[str, Any]] = []
    for c in args.concurrency:
        uniform, serving = _workloads(args, c, vocab, args.seed + c)
        samples: dict[str, list[dict[str, float]]] = {k: [] for k in runners}
        for rep in range(args.repeat):
            for name, serve in runners.items():
                samples[name].append(_measure(serve, uniform, serving, args.output_len))
                log(
                    f"c={c} rep={rep} {name}: "
                    + ", ".join(f"{k} {v:.1f}" for k, v in samples[name][-1].items())
                )
        row: dict[str, Any] = {"concurrency": c}
        for metric in ("prefill_tok_s", "decode_tok_s", "serving_tok_s"):
            ours, theirs = (median([s[metric] for s in samples[n]]) for n in runners)
            row[f"kvserve_{metric}"] = round(ours, 1)
            row[f"transformers_{metric}"] = round(theirs, 1)
            row[f"{metric.removesuffix('_tok_s')}_ratio"] = round(ours / theirs, 2)
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
            "serving_requests_per_concurrency": args.serve_factor,
            "serving_lengths": "prompt U[len/2, 3len/2]; output exp(mean len) in [2, 4len]",
            "block_tokens": config.block_tokens,
            "concurrency": args.concurrency,
            "max_num_batched_tokens": config.max_num_batched_tokens,
            "repeat": args.repeat,
            "statistic": "median",
            "seed": args.seed,
            "sampling": "greedy, ignore_eos",
            "baseline": "transformers generate; uniform: one unpadded batch; serving: "
            "static left-padded batches of c in arrival order",
        },
        results,
        {
            "metric": f"uniform decode tokens/s at concurrency {head['concurrency']}",
            "value": head["kvserve_decode_tok_s"],
            "baseline": head["transformers_decode_tok_s"],
            "ratio": head["decode_ratio"],
            "target": 3.0,
            "serving_ratio": head["serving_ratio"],
        },
    )
    return 0

"""``kvserve bench profile``: where one engine step's time goes.

For each concurrency ``c`` the engine takes ``c`` random prompts of ``prompt_len`` tokens and
runs until every request is decoding; then ``steps`` decode steps run under the torch
profiler (after as many unprofiled ones, whose median wall time is reported as
``step_ms``). The profiled steps' time is split into:

- ``attention``: inside the model's paged attention (cache write included);
- ``gemm``: matrix products outside attention (projections, MLP, LM head);
- ``sampling``: turning logits into tokens;
- ``metadata``: building the step's tensors (ids, positions, block tables, slots);
- ``other_ops``: every other torch op (norms, rotary, activations, embedding);
- ``python``: the rest of the step's wall time (scheduling, bookkeeping, op dispatch).

The scopes are added by wrapping the engine's functions here; the serving code carries no
profiler hooks. Shares are of the profiled wall time, which the profiler itself inflates
(mostly in ``python``): compare runs of this command with each other, not with ``step_ms``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch.autograd.profiler_util import FunctionEvent

from kvserve.bench.common import median_seconds, seconds
from kvserve.loadgen.workloads import random_tokens
from kvserve.report import emit, log
from kvserve.settings import BENCH_ENV, config_from_args, setting
from workers.config import EngineConfig
from workers.core.sequence import SamplingParams
from workers.engine.engine import Engine


@dataclass(frozen=True)
class ProfileBenchConfig:
    """The decode steps ``kvserve bench profile`` times.

    - ``concurrency``: sequences decoding together, one profile each;
    - ``prompt_len``: prompt tokens per sequence;
    - ``steps``: decode steps timed and profiled;
    - ``seed``: seed of the random prompts.
    """

    env_prefix: ClassVar[str] = BENCH_ENV
    concurrency: list[int] = setting([1, 16, 64])
    prompt_len: int = 512
    steps: int = 20
    seed: int = 0


SETTINGS = (ProfileBenchConfig, EngineConfig)
GEMM_OPS = frozenset(
    {
        "aten::mm",
        "aten::addmm",
        "aten::bmm",
        "aten::linear",
        "aten::matmul",
        "mkldnn::_linear_pointwise",
    }
)
SCOPES = {"attention": "kvserve::attention", "sampling": "kvserve::sample"}
METADATA = "kvserve::prepare"
PARTS = ("attention", "gemm", "sampling", "metadata", "other_ops", "python")


def _scoped(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with torch.profiler.record_function(name):
            return fn(*args, **kwargs)

    return wrapper


@contextlib.contextmanager
def instrumented(engine: Engine) -> Iterator[None]:
    """Profiler scopes around attention, sampling and step preparation, for the block."""
    import workers.engine.model_runner as runner_mod
    import workers.model.llama as llama

    targets: list[tuple[object, str, str]] = [
        (llama, "paged_attention", SCOPES["attention"]),
        (runner_mod, "sample", SCOPES["sampling"]),
        (engine.runner, "prepare", METADATA),
    ]
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in targets]
    for obj, name, scope in targets:
        setattr(obj, name, _scoped(scope, getattr(obj, name)))
    try:
        yield
    finally:
        for obj, name, fn in saved:
            setattr(obj, name, fn)


def split(events: list[FunctionEvent], wall_us: float) -> dict[str, float]:
    """Microseconds per part (see the module docstring) of a profile covering ``wall_us``.

    Only top-level events count (their children are inside them): a scope's whole time goes
    to its part, a top-level op's to ``gemm`` or ``other_ops``."""
    parts = dict.fromkeys(PARTS, 0.0)
    by_scope = {v: k for k, v in SCOPES.items()} | {METADATA: "metadata"}
    for ev in events:
        if ev.cpu_parent is not None:
            continue
        if ev.name in by_scope:
            parts[by_scope[ev.name]] += ev.cpu_time_total
        elif ev.name.startswith(("aten::", "mkldnn::")):
            parts["gemm" if ev.name in GEMM_OPS else "other_ops"] += ev.cpu_time_total
    parts["python"] = max(0.0, wall_us - sum(parts.values()))
    return parts


def _fill(engine: Engine, c: int, prompt_len: int, seed: int) -> None:
    """``c`` random prompts of ``prompt_len`` tokens, stepped until every one decodes."""
    rng = random.Random(seed)
    vocab = engine.model_config.vocab_size
    params = SamplingParams(
        max_tokens=engine.max_model_len - prompt_len, temperature=0, ignore_eos=True
    )
    for _ in range(c):
        engine.add_request(list(random_tokens(rng, prompt_len, vocab, low=0)), params)
    while any(s.num_uncomputed > 1 for s in engine.scheduler.running) or engine.scheduler.waiting:
        engine.step()


def profile_one(engine: Engine, c: int, args: argparse.Namespace) -> dict[str, Any]:
    """Profile ``args.steps`` decode steps at concurrency ``c``; aborts its requests after."""
    _fill(engine, c, args.prompt_len, args.seed + c)
    step_s = median_seconds(engine.step, args.steps, warmup=False)
    with (
        instrumented(engine),
        torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof,
    ):
        wall_us = seconds(lambda: [engine.step() for _ in range(args.steps)]) * 1e6
    parts = split(list(prof.events()), wall_us)
    for seq in list(engine.scheduler.running):
        engine.abort(seq.request_id)
    engine.scheduler.blocks.pool.reset_prefix_cache()
    row: dict[str, Any] = {
        "concurrency": c,
        "step_ms": round(step_s * 1e3, 2),
        "decode_tok_s": round(c / step_s, 1),
    }
    row.update({f"{k}_pct": round(100 * v / wall_us, 1) for k, v in parts.items()})
    log(f"c={c}: " + ", ".join(f"{k} {v}" for k, v in row.items()))
    return row


def run(args: argparse.Namespace) -> int:
    config = config_from_args(EngineConfig, args)
    engine = Engine(config)
    _fill(engine, 1, 16, args.seed)  # warm-up
    for seq in list(engine.scheduler.running):
        engine.abort(seq.request_id)
    rows = [profile_one(engine, c, args) for c in args.concurrency]
    conditions = {
        "model": engine.namespace.model,
        "dtype": config.dtype,
        "device": config.device,
        "prompt_len": args.prompt_len,
        "steps": args.steps,
        "block_tokens": config.block_tokens,
        "parts": list(PARTS),
        "statistic": "step_ms: median of unprofiled steps; *_pct: share of profiled wall time",
    }
    head = rows[len(rows) // 2]
    emit("profile", conditions, rows, {"concurrency": head["concurrency"], **head})
    return 0

"""``kvserve generate``: text from the model through the engine, one answer per prompt."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import ClassVar

from kvserve.settings import config_from_args, setting
from workers.config import EngineConfig
from workers.model.prepare import resolve_model_dir


@dataclass(frozen=True)
class GenerateConfig:
    """What ``kvserve generate`` asks for.

    - ``prompt``: prompts (read from stdin if none);
    - ``chat``: wrap each prompt in the model's chat template;
    - ``max_tokens``: most tokens generated per prompt;
    - ``temperature``: sampling temperature (0: greedy);
    - ``top_p``: nucleus sampling: the smallest set of tokens with this much probability
      (1: all);
    - ``top_k``: sample among the k likeliest tokens (0: all);
    - ``seed``: sampling seed (none: random);
    - ``stop``: stop before this text (repeat the flag for several).
    """

    env_prefix: ClassVar[str] = "KVSERVE_GENERATE_"
    prompt: list[str] = setting([], positional=True, nargs="*")
    chat: bool = True
    max_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] = setting([], append=True)


SETTINGS = (GenerateConfig, EngineConfig)


def run(args: argparse.Namespace) -> int:
    """Generate for each prompt and print the texts (the counts to stderr); a missing model
    is a one-line error before the engine (and torch) is imported."""
    config = config_from_args(EngineConfig, args)
    resolve_model_dir(config.model)  # FileNotFoundError: kvserve.cli prints it, exits 2
    from workers.core.sequence import SamplingParams
    from workers.engine.engine import Engine

    engine = Engine(config)
    tok = engine.tokenizer
    prompts = args.prompt or [sys.stdin.read()]
    ids = [
        tok.encode_chat([{"role": "user", "content": p}]) if args.chat else tok.encode(p)
        for p in prompts
    ]
    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        stop=tuple(args.stop),
    )
    for prompt, out in zip(prompts, engine.generate(ids, params), strict=True):
        if len(prompts) > 1:
            print(f"### {prompt}")
        print(out.text)
    s = engine.stats
    print(
        f"[{len(prompts)} request(s), {s.output_tokens} tokens in {s.busy_seconds:.2f}s, "
        f"{s.steps} steps]",
        file=sys.stderr,
    )
    return 0

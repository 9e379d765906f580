"""``kvserve bench hashing``: what the keyed prefix identity and the block digests cost.

Three measurements in one process, each the median of ``--repeat`` runs:

1. **prefix chain**: microseconds per 1,000 prompt tokens of
   :meth:`kvpool.hashing.PrefixHasher.chain` (a salted root included, as every request
   pays it), for ``sha256`` and ``xxh3`` at each ``--block-tokens``, against the chain this
   replaced (hash version 1: unkeyed xxh3-64, reproduced here as :func:`legacy_chain`);
2. **layer digests**: microseconds per 1,000 tokens of KV of
   :func:`kvpool.meta.layer_digest` (SHA-256 truncated to 16 bytes, or xxh3-64) over one
   span per (layer, block) as the pool writes them, for the KV shapes of the tiny model and
   of SmolLM2-135M (layers, KV heads and head size from their ``config.json``; the KV dtype
   is ``--dtype``, the engine's default);
3. **prefill**: the time the engine takes to prefill 1,000 prompt tokens of the tiny model
   (one request, a fresh random prompt each run), which 1 and 2 are compared with
   (``vs_tiny_prefill``); with ``--prefill-smollm2`` also SmolLM2-135M's, which its own
   layer digests are compared with (``vs_own_prefill``; about 3 s per run on 2 idle cores,
   so ~25 s more).

The chain runs on the engine thread (admission, and each step's new blocks); the digests run
on the pool writer's helper thread and the lander thread, overlapped with compute, so on an
idle machine their cost is hidden: the ratios bound what they could take from prefill. The
load average at the start is in the conditions (the figures are wall-clock).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import xxhash

from kvpool.hashing import ALGORITHMS, Namespace, PrefixHasher
from kvpool.layout import ELEMENT_BYTES
from kvpool.meta import LayerDigest, layer_digest
from kvserve.bench.common import median_seconds
from kvserve.report import emit, log
from kvserve.settings import BENCH_ENV, setting
from workers.config import EngineConfig

PER = 1000
"""Figures are per this many tokens."""
LEGACY = "legacy-xxh3-64 (unkeyed, v1)"
"""The baseline's row (:func:`legacy_chain`)."""


@dataclass(frozen=True)
class HashingConfig:
    """What ``kvserve bench hashing`` times.

    - ``prompt_tokens``: tokens of the chained prompt;
    - ``block_tokens``: block sizes of the chain, one row each;
    - ``dtype``: the KV's element type, for the digests;
    - ``prefill_tokens``: tokens of the prefill compared with;
    - ``prefill_smollm2``: also time SmolLM2's prefill;
    - ``repeat``: runs per measurement (the median is reported);
    - ``seed``: seed of the random tokens and data.
    """

    env_prefix: ClassVar[str] = BENCH_ENV
    prompt_tokens: int = 8192
    block_tokens: list[int] = setting([16, EngineConfig.block_tokens])
    dtype: str = setting(EngineConfig.dtype, choices=tuple(sorted(ELEMENT_BYTES)))
    prefill_tokens: int = PER
    prefill_smollm2: bool = False
    repeat: int = 5
    seed: int = 0


SETTINGS = (HashingConfig,)


def legacy_chain(token_ids: Sequence[int], block_tokens: int, seed: int) -> list[int]:
    """Hash version 1 (the baseline): ``xxh3_64(parent as 8 bytes || tokens, seed)`` from 0,
    unkeyed, as ``kvpool.hashing.hash_chain`` computed it before the keyed chain."""
    names: list[int] = []
    parent = 0
    for start in range(0, len(token_ids) - block_tokens + 1, block_tokens):
        block = np.asarray(token_ids[start : start + block_tokens], dtype="<u4").tobytes()
        parent = xxhash.xxh3_64_intdigest(parent.to_bytes(8, "little") + block, seed=seed)
        names.append(parent)
    return names


def salted_chain(hasher: PrefixHasher, tokens: Sequence[int], block_tokens: int) -> list[int]:
    """What a request pays: its salt's root, then its prompt's chain."""
    return hasher.chain(tokens, block_tokens, hasher.root("tenant"))


def digest_all(digest: LayerDigest, ptrs: list[int], size: int) -> list[bytes]:
    return [digest(ptr, size) for ptr in ptrs]


def chain_costs(args: argparse.Namespace, tokens: list[int]) -> list[dict[str, Any]]:
    """Rows of measurement 1: per block size, the baseline then each algorithm, microseconds
    per 1,000 tokens."""
    rows: list[dict[str, Any]] = []
    key = os.urandom(32)
    for bt in args.block_tokens:
        ns = Namespace(model="bench@0", dtype=args.dtype, block_tokens=bt)
        works = {LEGACY: partial(legacy_chain, tokens, bt, ns.seed)}
        for algorithm in ALGORITHMS:
            hasher = PrefixHasher(Namespace(ns.model, ns.dtype, bt, algorithm), key)
            works[algorithm] = partial(salted_chain, hasher, tokens, bt)
        us = {name: 1e6 * median_seconds(work, args.repeat) for name, work in works.items()}
        rows += [
            {
                "what": "prefix chain",
                "algorithm": name,
                "block_tokens": bt,
                "us": t,
                "vs_legacy": round(t / us[LEGACY], 2),
            }
            for name, t in us.items()
        ]
    return rows


def digest_costs(
    args: argparse.Namespace, shapes: dict[str, tuple[int, int, int]]
) -> list[dict[str, Any]]:
    """Rows of measurement 2: per model shape ``(layers, kv_heads, head_dim)`` and algorithm,
    the digests of ``args.prefill_tokens`` tokens of KV in spans of the engine's block."""
    rows: list[dict[str, Any]] = []
    bt = EngineConfig.block_tokens
    rng = np.random.default_rng(args.seed)
    for name, (layers, kv_heads, head_dim) in shapes.items():
        span = 2 * bt * kv_heads * head_dim * ELEMENT_BYTES[args.dtype]
        blocks = -(-args.prefill_tokens // bt)
        buf = rng.integers(0, 256, layers * blocks * span, dtype=np.uint8)
        ptrs = [buf.ctypes.data + i * span for i in range(layers * blocks)]
        for algorithm in ALGORITHMS:
            work = partial(digest_all, layer_digest(algorithm), ptrs, span)
            us = 1e6 * median_seconds(work, args.repeat)
            rows.append(
                {
                    "what": "layer digests",
                    "algorithm": algorithm,
                    "model": name,
                    "kv_bytes": buf.nbytes,
                    "span_bytes": span,
                    "us": us * PER / (blocks * bt),
                    "gb_per_s": round(buf.nbytes / us / 1e3, 2),
                }
            )
    return rows


def prefill_us(model_dir: Path, args: argparse.Namespace) -> float:
    """Measurement 3: median microseconds to prefill ``args.prefill_tokens`` of the model."""
    from workers.core.sequence import SamplingParams
    from workers.engine.engine import Engine

    engine = Engine(EngineConfig(model=str(model_dir), dtype=args.dtype, kv_cache_mib=64))
    rng = np.random.default_rng(args.seed)
    vocab = engine.model_config.vocab_size

    def prefill() -> None:
        prompt = rng.integers(0, vocab, args.prefill_tokens).tolist()
        engine.generate([prompt], SamplingParams(max_tokens=1, temperature=0))

    try:
        return 1e6 * median_seconds(prefill, args.repeat)
    finally:
        engine.close()


def models() -> dict[str, tuple[Path, tuple[int, int, int]]]:
    """The tiny model (made on first use, as ``kvserve chaos`` does) and SmolLM2-135M: each
    one's directory and its ``(layers, kv_heads, head_dim)``, from its ``config.json``."""
    from workers.model.config import load_model_config
    from workers.model.prepare import prepare_default_model, tiny_model_dir

    out = {}
    for name, path in (("tiny-llama", tiny_model_dir()), ("SmolLM2-135M", prepare_default_model())):
        cfg = load_model_config(path)
        out[name] = path, (cfg.num_layers, cfg.num_kv_heads, cfg.head_dim)
    return out


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    load = os.getloadavg()[0]
    found = models()
    shapes = {name: shape for name, (_, shape) in found.items()}
    tokens = np.random.default_rng(args.seed).integers(0, 49152, args.prompt_tokens).tolist()
    log("prefix chains ...")
    rows = chain_costs(args, tokens)
    log("layer digests ...")
    rows += digest_costs(args, shapes)
    timed = [name for name in found if name == "tiny-llama" or args.prefill_smollm2]
    prefills: dict[str, float] = {}
    for name in timed:
        log(f"{name} prefill ...")
        prefills[name] = prefill_us(found[name][0], args) * PER / args.prefill_tokens
    for row in rows:
        if row["what"] == "prefix chain":
            row["us"] *= PER / args.prompt_tokens
        row["us_per_1k_tokens"] = round(row.pop("us"), 1)
        row["vs_tiny_prefill"] = round(row["us_per_1k_tokens"] / prefills["tiny-llama"], 5)
        if row.get("model") in prefills:
            row["vs_own_prefill"] = round(row["us_per_1k_tokens"] / prefills[row["model"]], 5)
    rows += [
        {"what": "prefill", "model": name, "us_per_1k_tokens": round(us, 1)}
        for name, us in prefills.items()
    ]
    bt = EngineConfig.block_tokens
    sha = next(r for r in rows if r["algorithm"] == "sha256" and r.get("block_tokens") == bt)
    digest = next(r for r in rows if r.get("model") == "tiny-llama" and r["algorithm"] == "sha256")
    emit(
        "hashing",
        {
            "prompt_tokens": args.prompt_tokens,
            "block_tokens": args.block_tokens,
            "digest_block_tokens": bt,
            "kv_dtype": args.dtype,
            "prefill_tokens": args.prefill_tokens,
            "kv_shapes_layers_kvheads_headdim": shapes,
            "repeat": args.repeat,
            "statistic": "median wall time",
            "loadavg_1m_at_start": round(load, 2),
            "chain_includes": "one salted root (HMAC-SHA256) per prompt",
            "digests": "sha256: SHA-256 of each span, first 16 bytes; xxh3: xxh3-64",
            "seconds": round(time.monotonic() - started, 1),
        },
        rows,
        {
            "metric": f"sha256 chain (block {bt}) + sha256 layer digests of the tiny model, "
            "per 1,000 tokens, as a share of the tiny model's prefill of 1,000 tokens",
            "value": round(sha["vs_tiny_prefill"] + digest["vs_tiny_prefill"], 4),
            "chain_vs_legacy": sha["vs_legacy"],
        },
    )
    return 0

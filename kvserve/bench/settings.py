"""The settings of the engine-level ``kvserve bench`` verbs (``engine``, ``profile``,
``overlap``, ``prefix``, ``pool``); the others declare theirs in their own modules, and the
pool segment of the verbs that start a cluster is
:class:`kvserve.cluster.deployment.SegmentConfig`. Their variables are ``KVSERVE_BENCH_*``
(:data:`kvserve.settings.BENCH_ENV`), apart from the engine settings they share with
``kvserve worker``."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import ClassVar

from kvpool.config import STAGING_SETTINGS, PoolConfig
from kvserve.settings import BENCH_ENV, add_config_args, setting
from workers.config import EngineConfig


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


@dataclass(frozen=True)
class OverlapBenchConfig:
    """The prompts of ``kvserve bench overlap``.

    - ``lengths``: prompt lengths, one measurement each;
    - ``modes``: how the KV is handed off: ``after`` (streaming off: written after compute,
      read after the first token), ``streaming`` (through the pool layer by layer, landed
      as it arrives), ``push`` (written straight into the decode engine's pages layer by
      layer, the pool in the background; on the same engines as ``streaming``);
    - ``repeat``: runs per measurement (the median is reported);
    - ``seed``: seed of the random prompts;
    - ``segment_mib``: pool memory per engine.
    """

    env_prefix: ClassVar[str] = BENCH_ENV
    lengths: list[int] = setting([512, 1024, 2048, 4096])
    modes: list[str] = setting(["after", "streaming"], choices=("after", "streaming", "push"))
    repeat: int = 3
    seed: int = 0
    segment_mib: int = 1024


@dataclass(frozen=True)
class PrefixBenchConfig:
    """The prompts of ``kvserve bench prefix``.

    - ``prefix``: shared prefix tokens;
    - ``tail``: tokens after the prefix;
    - ``repeat``: runs per measurement (the median is reported);
    - ``seed``: seed of the random prompts;
    - ``segment_mib``: pool memory per worker.
    """

    env_prefix: ClassVar[str] = BENCH_ENV
    prefix: int = 2048
    tail: int = 32
    repeat: int = 4
    seed: int = 0
    segment_mib: int = 512


@dataclass(frozen=True)
class PoolBenchConfig:
    """The transfers of ``kvserve bench pool``.

    - ``sizes_kib``: block sizes to put and get;
    - ``batches``: blocks per batched call;
    - ``max_batch_mib``: skip size x batch combinations above this many MiB;
    - ``repeat``: runs per measurement (the median is reported);
    - ``seed``: seed of the random data.
    """

    env_prefix: ClassVar[str] = BENCH_ENV
    sizes_kib: list[int] = setting([16, 64, 256, 1024, 4096])
    batches: list[int] = setting([1, 4, 16, 64, 256])
    max_batch_mib: int = 256
    repeat: int = 3
    seed: int = 0


ENGINE = (EngineBenchConfig, EngineConfig)
PROFILE = (ProfileBenchConfig, EngineConfig)


def overlap_arguments(parser: argparse.ArgumentParser) -> None:
    """``bench overlap``: its prompts, the engine, and the pool's staging settings
    (``--kv-staging always`` measures what streaming hides through host staging)."""
    for cls in (OverlapBenchConfig, EngineConfig):
        add_config_args(parser, cls)
    add_config_args(parser, PoolConfig, only=STAGING_SETTINGS)


PREFIX = (PrefixBenchConfig, EngineConfig)
POOL = (PoolBenchConfig,)

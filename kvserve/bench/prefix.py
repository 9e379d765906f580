"""``kvserve bench prefix``: TTFT of a prompt whose long prefix is already in the pool, on a
prefill worker that never saw it, against the same-length prompt cold.

Starts a real cluster on this machine (mooncake_master, Redis, router, 2 prefill + 1 decode
workers; round-robin placement, every request disaggregated) and, per repetition, sends
through the router's streaming completions API:

1. ``writer``: prefix P + a short tail A (P is computed on prefill worker X and lands in
   the pool);
2. ``warm``: P + tail S, placed on the other prefill worker Y (round robin), which loads P
   from the pool and computes only S;
3. ``cold``: a fresh prefix Q of the same length + S, on worker X, computed in full.

TTFT is the time from sending the request to the first streamed chunk, as a client sees it.
Repetitions alternate which worker is X. ``ratio = median(warm) / median(cold)``; the JSON
also carries each request's cached tokens (from its usage) to show the hits were real.
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass
from typing import Any, ClassVar

from kvserve.bench.common import openai_client, ratio_headline, started, stream_ttft
from kvserve.loadgen.workloads import random_tokens
from kvserve.report import emit, log, median
from kvserve.settings import BENCH_ENV, config_from_args
from workers.config import EngineConfig


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


SETTINGS = (PrefixBenchConfig, EngineConfig)


def run(args: argparse.Namespace) -> int:
    config = config_from_args(EngineConfig, args)
    rng = random.Random(args.seed)
    rows: list[dict[str, Any]] = []
    options = {"policy": "round_robin", "disagg_threshold_tokens": 0}
    with started("2p1d", config, args.segment_mib, **options) as cluster:
        placement = {"shared_cores": cluster.plan.shared_cores, "notes": list(cluster.plan.notes)}
        client = openai_client(cluster.router_url)
        model = client.models.list().data[0].id

        def tokens(n: int) -> list[int]:
            return list(random_tokens(rng, n, 49152))

        for _ in range(2):  # warm-up: one small request per prefill worker
            stream_ttft(client, model, tokens(64), 2)
        for rep in range(args.repeat):
            prefix, other, tail = tokens(args.prefix), tokens(args.prefix), tokens(args.tail)
            for kind, prompt in (
                ("writer", [*prefix, *tokens(args.tail)]),
                ("warm", [*prefix, *tail]),
                ("cold", [*other, *tail]),
            ):
                seconds, cached = stream_ttft(client, model, prompt, 2)
                rows.append({"rep": rep, "kind": kind, "ttft_s": seconds, "cached": cached})
                log(f"rep {rep} {kind:6s} ttft {seconds:.3f}s cached {cached}")
    warm = median([r["ttft_s"] for r in rows if r["kind"] == "warm"])
    cold = median([r["ttft_s"] for r in rows if r["kind"] == "cold"])
    emit(
        "prefix",
        {
            "model": config.model or "SmolLM2-135M-Instruct",
            "prefix_tokens": args.prefix,
            "tail_tokens": args.tail,
            "block_tokens": config.block_tokens,
            "max_num_batched_tokens": config.max_num_batched_tokens,
            "deployment": "2 prefill + 1 decode workers, round robin, all disaggregated",
            "placement": placement,
            "repeat": args.repeat,
            "seed": args.seed,
        },
        [{"warm_ttft_s": warm, "cold_ttft_s": cold}, {"runs": rows}],
        ratio_headline("TTFT with the prefix in the pool / TTFT cold (median)", warm, cold, 0.15),
    )
    return 0

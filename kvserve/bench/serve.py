"""``kvserve bench serve``: a serving benchmark against any OpenAI-compatible server.

1. The model is ``--model`` or the first of ``GET /v1/models``.
2. The workload (:func:`~kvserve.loadgen.options.build_workload`) is built once from
   the seed. Warm-up requests are its first ``--warmup`` requests, salted (token ids shifted,
   :func:`~kvserve.loadgen.workloads.salted`) so they warm the server, not the cache.
3. With ``--slo-relative``, ``--calibration-requests`` requests spread evenly over the
   workload, salted apart, are sent one at a time (concurrency 1); the SLO targets are the
   factors times the median unloaded TTFT and TBT per input-length bucket
   (:func:`~kvserve.loadgen.slo.relative_slo`). Otherwise ``--slo-*-s`` give absolute
   targets, or there is no SLO.
4. For each rate, the workload is salted with the rate's position (same lengths and prefix
   sharing, fresh tokens: no run hits another's cache), given arrival times, and sent with
   :func:`run_load`; the server's KV counters are read before and after (null for servers
   without them); the run is summarised overall and per input and output (requested
   ``max_tokens``) length bucket. The conversation workload's conversations start at the
   rate's arrival times and are driven turn by turn
   (:func:`~kvserve.loadgen.conversation_client.run_conversations`: token-id prompts, each
   holding the previous answers' ids as the server returned them, which needs vLLM's
   ``return_token_ids``); its rows add a per-turn summary (``conversation``); its first
   turns stand for its requests in steps 2-3.
5. The sweep's goodput (DistServe: the highest rate with attainment >= the threshold, and
   the interpolated one) is the headline when there is an SLO; else output tokens/s.
6. One JSON object goes to stdout; with ``--out``, also ``serve.json``, the per-request
   records of run ``i`` as ``records_<i>.jsonl`` and PNG plots.

The rows, conditions, headline and files are :mod:`kvserve.loadgen.sweep`'s, shared with
``kvserve sim serve``.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from kvserve.loadgen import options as opt
from kvserve.loadgen import sweep
from kvserve.loadgen.client import ClientOptions, fetch_models, run_load
from kvserve.loadgen.conversation import salted_plans
from kvserve.loadgen.conversation_client import run_conversations
from kvserve.loadgen.counters import counters_delta, scrape_counters
from kvserve.loadgen.metrics import RequestRecord
from kvserve.loadgen.slo import Slo, relative_slo
from kvserve.loadgen.workloads import RequestSpec, salted, with_arrivals
from kvserve.report import log

add_arguments = opt.add_arguments


def text_decoder(args: argparse.Namespace, model: str) -> Callable[[Sequence[int]], str] | None:
    """Text prompts (``--prompt-format text``, never for conversations): token ids decoded
    by the tokenizer (default: the model's)."""
    if opt.prompt_format(args) == "ids":
        return None
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or model)
    return lambda ids: str(tokenizer.decode(list(ids)))


async def calibrate(
    args: argparse.Namespace, model: str, specs: list[RequestSpec], client: ClientOptions
) -> Slo | None:
    """The SLO: relative (from unloaded requests, ``--calibration-requests`` evenly spaced
    over ``specs``, sent back to back), absolute, or none (module docstring)."""
    if args.slo_relative is None:
        return opt.absolute_slo(args)
    n = min(args.calibration_requests, len(specs)) if args.calibration_requests > 0 else 0
    chosen = [specs[int(i * (len(specs) / n))] for i in range(n)]
    sample = salted(with_arrivals(chosen, [0.0] * n), sweep.CALIBRATION_SALT, args.vocab)
    log(f"bench serve: calibrating relative SLOs on {len(sample)} unloaded requests")
    unloaded = await run_load(
        args.url, model, sample, 1, options=client, progress=args.progress, desc="unloaded"
    )
    ttft_factor, tbt_factor = args.slo_relative
    return relative_slo(unloaded, ttft_factor, tbt_factor, args.input_buckets)


async def one_rate(
    args: argparse.Namespace,
    model: str,
    workload: opt.Workload,
    salt: int,
    rate: float | None,
    client: ClientOptions,
    slo: Slo | None,
) -> tuple[dict[str, Any], list[RequestRecord]]:
    """Run the workload, salted with ``salt``, at ``rate``: its result row and records."""
    before = await scrape_counters(args.url)
    sending: dict[str, Any] = {"options": client, "progress": args.progress}
    sending["desc"] = f"rate {opt.json_rate(rate)}"
    if workload.conversations is not None:
        plans = salted_plans(workload.conversations, salt, args.vocab)
        timed = sweep.timed_conversations(args, plans, rate)
        records = await run_conversations(args.url, model, timed, args.concurrency, **sending)
    else:
        specs = sweep.timed(args, salted(workload.specs, salt, args.vocab), rate)
        records = await run_load(args.url, model, specs, args.concurrency, **sending)
    server = counters_delta(before, await scrape_counters(args.url))
    return sweep.rate_row(args, rate, records, slo, server), records


def serve_bench(args: argparse.Namespace) -> dict[str, Any]:
    """Steps 1-5 of the module docstring: conditions, rows, headline and records per rate
    (each step on an event loop of its own: :func:`kvserve.loadgen.sweep.run_sweep` drives
    the rates, as it does the simulator's)."""
    model = args.model or asyncio.run(fetch_models(args.url))[0]
    workload = opt.build_workload(args)
    client = ClientOptions(args.timeout_s, args.ignore_eos, text_decoder(args, model))
    slo = asyncio.run(calibrate(args, model, workload.specs, client))
    warmup = salted(workload.specs[: args.warmup], sweep.WARMUP_SALT, args.vocab)
    if warmup:
        asyncio.run(run_load(args.url, model, [], options=client, warmup=warmup, progress=False))

    def rate_run(i: int, rate: float | None) -> tuple[dict[str, Any], list[RequestRecord]]:
        return asyncio.run(one_rate(args, model, workload, i, rate, client, slo))

    conditions = {"url": args.url, "model": model, **sweep.load_conditions(args, workload, slo)}
    return sweep.run_sweep(args, rate_run, slo, conditions)


def run(args: argparse.Namespace) -> int:
    """Run the benchmark and print its JSON (see the module docstring); 0 on success."""
    return sweep.report("serve", args, serve_bench(args))

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
   ``max_tokens``) length bucket.
5. The sweep's goodput (DistServe: the highest rate with attainment >= the threshold, and
   the interpolated one) is the headline when there is an SLO; else output tokens/s.
6. One JSON object goes to stdout; with ``--out``, also ``serve.json``, the per-request
   records of run ``i`` as ``records_<i>.jsonl`` and PNG plots.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kvserve.loadgen import options as opt
from kvserve.loadgen.arrivals import arrival_times
from kvserve.loadgen.client import (
    ClientOptions,
    counters_delta,
    fetch_models,
    run_load,
    scrape_counters,
)
from kvserve.loadgen.metrics import RequestRecord, bucketed, span_s, summarize
from kvserve.loadgen.slo import Slo, relative_slo, sweep_goodput
from kvserve.loadgen.workloads import RequestSpec, salted, with_arrivals
from kvserve.report import base_conditions, emit, log

__all__ = ["add_arguments", "run", "run_load"]

add_arguments = opt.add_arguments
WARMUP_SALT = 1_000_001
CALIBRATION_SALT = 1_000_002


def text_decoder(args: argparse.Namespace, model: str) -> Callable[[Sequence[int]], str] | None:
    """``--prompt-format text``: token ids decoded by the tokenizer (default: the model's)."""
    if args.prompt_format == "ids":
        return None
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or model)
    return lambda ids: str(tokenizer.decode(list(ids)))


def spread_sample(specs: Sequence[RequestSpec], n: int) -> list[RequestSpec]:
    """``n`` requests evenly spaced over ``specs``, sent back to back (arrival 0)."""
    if n <= 0 or not specs:
        return []
    step = len(specs) / min(n, len(specs))
    chosen = [specs[int(i * step)] for i in range(min(n, len(specs)))]
    return with_arrivals(chosen, [0.0] * len(chosen))


def timed(
    args: argparse.Namespace, specs: list[RequestSpec], rate: float | None
) -> list[RequestSpec]:
    """``specs`` with the arrival times of ``--arrival`` at ``rate``."""
    times = arrival_times(
        opt.arrival_process(args),
        len(specs),
        rate,
        args.seed,
        cv=args.burstiness_cv,
        timestamps_s=[s.arrival_s for s in specs],
        time_scale=args.time_scale,
    )
    return with_arrivals(specs, times)


async def calibrate(
    args: argparse.Namespace, model: str, specs: list[RequestSpec], client: ClientOptions
) -> Slo | None:
    """The SLO: relative (from unloaded requests), absolute, or none (module docstring)."""
    if args.slo_relative is None:
        return opt.absolute_slo(args)
    sample = salted(spread_sample(specs, args.calibration_requests), CALIBRATION_SALT, args.vocab)
    log(f"bench serve: calibrating relative SLOs on {len(sample)} unloaded requests")
    unloaded = await run_load(
        args.url, model, sample, 1, options=client, progress=args.progress, desc="unloaded"
    )
    ttft_factor, tbt_factor = args.slo_relative
    return relative_slo(unloaded, ttft_factor, tbt_factor, args.input_buckets)


async def one_rate(
    args: argparse.Namespace,
    model: str,
    specs: list[RequestSpec],
    rate: float | None,
    client: ClientOptions,
    slo: Slo | None,
) -> tuple[dict[str, Any], list[RequestRecord]]:
    """Run the workload at ``rate``: its result row and records."""
    before = await scrape_counters(args.url)
    records = await run_load(
        args.url,
        model,
        timed(args, specs, rate),
        args.concurrency,
        options=client,
        progress=args.progress,
        desc=f"rate {opt.json_rate(rate)}",
    )
    server = counters_delta(before, await scrape_counters(args.url))
    return rate_row(args, rate, records, slo, server), records


def rate_row(
    args: argparse.Namespace,
    rate: float | None,
    records: list[RequestRecord],
    slo: Slo | None,
    server: dict[str, Any] | None,
    label: str = "bench serve",
) -> dict[str, Any]:
    """The result row of one rate's records (shared with ``kvserve sim serve``)."""
    duration = span_s(records)
    meets = slo.meets if slo else None
    summary = summarize(records, duration, meets)
    log(
        f"{label}: rate {opt.json_rate(rate)}: {summary.completed}/{summary.requests}"
        f" done, {summary.output_throughput:.1f} tok/s, attainment {summary.slo_attainment}"
    )
    return {
        "rate": opt.json_rate(rate),
        "offered_rate": offered_rate(records),
        "arrival": opt.arrival_process(args),
        "summary": summary.to_json(),
        "by_input_len": bucketed(
            records, duration, args.input_buckets, lambda r: r.prompt_len, meets
        ),
        "by_output_len": bucketed(
            records, duration, args.output_buckets, lambda r: r.max_tokens, meets
        ),
        "server": server,
        "errors": sorted({r.error for r in records if r.error})[:5],
    }


def offered_rate(records: Sequence[RequestRecord]) -> float | None:
    """Requests per second as scheduled: ``(n - 1) / (last - first arrival)`` (None if 0)."""
    times = [r.arrival_s for r in records]
    span = max(times) - min(times) if times else 0.0
    return (len(times) - 1) / span if span > 0 else None


def sweep_point(row: dict[str, Any]) -> tuple[float, float | None]:
    """``(rate, attainment)`` of a row: its rate, else (trace timing) its offered rate."""
    rate = row["rate"]
    value = math.inf if rate == "inf" else rate if rate is not None else row["offered_rate"]
    return (value if value is not None else math.inf), row["summary"]["slo_attainment"]


async def serve_bench(args: argparse.Namespace) -> dict[str, Any]:
    """Steps 1-5 of the module docstring: conditions, rows, headline and records per rate."""
    model = args.model or (await fetch_models(args.url))[0]
    workload = opt.build_workload(args)
    client = ClientOptions(args.timeout_s, args.ignore_eos, text_decoder(args, model))
    slo = await calibrate(args, model, workload.specs, client)
    warmup = salted(workload.specs[: args.warmup], WARMUP_SALT, args.vocab)
    if warmup:
        await run_load(args.url, model, [], options=client, warmup=warmup, progress=False)
    rows, runs = [], []
    for i, rate in enumerate(opt.rates(args)):
        specs = salted(workload.specs, i, args.vocab)
        row, records = await one_rate(args, model, specs, rate, client, slo)
        rows.append(row)
        runs.append((f"rate {row['rate']}", records))
    points = [sweep_point(row) for row in rows]
    sweep = sweep_goodput(points, args.goodput_threshold) if slo else None
    conditions = {"url": args.url, "model": model, **load_conditions(args, workload, slo)}
    return {"conditions": conditions, "rows": rows, "sweep": sweep, "runs": runs, "points": points}


def load_conditions(
    args: argparse.Namespace, workload: opt.Workload, slo: Slo | None
) -> dict[str, Any]:
    """The conditions of the workload, load and SLO (shared with ``kvserve sim serve``)."""
    return {
        "workload": args.workload,
        "num_requests": len(workload.specs),
        "workload_params": workload.conditions,
        "arrival": opt.arrival_process(args),
        "rates": [opt.json_rate(r) for r in opt.rates(args)],
        "burstiness_cv": args.burstiness_cv,
        "concurrency": args.concurrency,
        "warmup": args.warmup,
        "seed": args.seed,
        "vocab": args.vocab,
        "timeout_s": args.timeout_s,
        "prompt_format": args.prompt_format,
        "ignore_eos": args.ignore_eos,
        "slo": slo.to_json() if slo else None,
        "goodput_threshold": args.goodput_threshold,
        "input_buckets": args.input_buckets,
        "output_buckets": args.output_buckets,
        "deployment": opt.deployment_labels(args.deployment),
    }


def headline(rows: list[dict[str, Any]], sweep: Any) -> dict[str, Any]:
    """DistServe goodput over a sweep; good requests/s for one rate with an SLO; else the
    best output tokens/s."""
    if sweep is not None and len(rows) == 1:
        return {
            "metric": "goodput: requests/s meeting the SLO",
            "value": rows[0]["summary"]["goodput_rps"],
            "slo_attainment": rows[0]["summary"]["slo_attainment"],
            "baseline": None,
            "ratio": None,
            "target": None,
        }
    if sweep is not None:
        return {
            "metric": f"goodput: highest req/s with >= {sweep.threshold:.0%} SLO attainment "
            "(DistServe, interpolated)",
            "value": sweep.interpolated_rate,
            "highest_passing_rate": sweep.highest_passing_rate,
            "baseline": None,
            "ratio": None,
            "target": None,
        }
    best = max(rows, key=lambda r: float(r["summary"]["output_throughput"]))
    return {
        "metric": "output tokens/s (best rate)",
        "value": best["summary"]["output_throughput"],
        "rate": best["rate"],
        "baseline": None,
        "ratio": None,
        "target": None,
    }


def write_out(out: Path, payload: dict[str, Any], result: dict[str, Any]) -> list[str]:
    """``serve.json`` and the plots into ``out``; the files written."""
    from kvserve.loadgen import plots

    out.mkdir(parents=True, exist_ok=True)
    (out / "serve.json").write_text(json.dumps(payload, indent=2) + "\n")
    for i, (_, records) in enumerate(result["runs"]):
        lines = [json.dumps(dataclasses.asdict(r)) for r in records]
        (out / f"records_{i}.jsonl").write_text("\n".join(lines) + "\n")
    files = [plots.latency_cdfs(result["runs"], out / "latency_cdf.png")]
    if result["sweep"] is not None:
        series = [("this deployment", result["points"])]
        files.append(plots.attainment_vs_rate(series, out / "attainment_vs_rate.png"))
        bars = [(str(r["rate"]), r["summary"]["goodput_rps"]) for r in result["rows"]]
        files.append(plots.goodput_bars(bars, out / "goodput.png", "good requests/s"))
    return [str(f) for f in files]


def results_and_headline(result: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The JSON's ``results`` (a row per rate, then the sweep) and ``headline``."""
    rows = list(result["rows"])
    if result["sweep"] is not None:
        sweep = result["sweep"]
        by_rate = [[opt.json_rate(r), a] for r, a in result["points"]]
        rows.append({"goodput_sweep": sweep.__dict__, "attainment_by_rate": by_rate})
    return rows, headline(result["rows"], result["sweep"])


def run(args: argparse.Namespace) -> int:
    """Run the benchmark and print its JSON (see the module docstring); 0 on success."""
    result = asyncio.run(serve_bench(args))
    rows, head = results_and_headline(result)
    payload = {
        "bench": "serve",
        "conditions": result["conditions"],
        "results": rows,
        "headline": head,
    }
    if args.out is not None:
        conditions = {**base_conditions(), **result["conditions"]}
        files = write_out(args.out, {**payload, "conditions": conditions}, result)
        log(f"bench serve: wrote {', '.join(files)}")
    emit("serve", result["conditions"], rows, head)
    return 0

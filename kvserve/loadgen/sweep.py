"""The sweep's pieces shared by ``kvserve bench serve`` (a real server) and ``kvserve sim
serve`` (a simulated cluster), so a simulated and a measured run compare line by line:
the salts of the warm-up and calibration requests, the arrival times of a rate
(:func:`timed`; of conversations, :func:`timed_conversations`), the JSON row of one rate's
records (:func:`rate_row`; with a ``conversation`` block for a conversation workload's,
:func:`~kvserve.loadgen.conversation.conversation_summary`) and its point on the
attainment curve (:func:`sweep_point`), the conditions of the load (:func:`load_conditions`),
the ``results`` and ``headline`` of a sweep (:func:`results_and_headline`) and the files of
``--out`` (:func:`write_out`); and the sweep itself, whatever serves it: every rate in turn
through a live server's or the simulated cluster's ``one_rate`` (:func:`run_sweep`), then
the JSON and files (:func:`report`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kvserve.loadgen import options as opt
from kvserve.loadgen.arrivals import arrival_times
from kvserve.loadgen.conversation import ConversationPlan, conversation_summary, with_starts
from kvserve.loadgen.metrics import RequestRecord, bucketed, span_s, summarize
from kvserve.loadgen.slo import Slo, sweep_goodput
from kvserve.loadgen.workloads import RequestSpec, with_arrivals
from kvserve.report import base_conditions, command, emit, log

WARMUP_SALT = 1_000_001
CALIBRATION_SALT = 1_000_002


def arrivals(args: argparse.Namespace, stamps_s: list[float], rate: float | None) -> list[float]:
    """One arrival time of ``--arrival`` at ``rate`` per timestamp (trace: the stamps')."""
    return arrival_times(
        opt.arrival_process(args),
        len(stamps_s),
        rate,
        args.seed,
        cv=args.burstiness_cv,
        timestamps_s=stamps_s,
        time_scale=args.time_scale,
    )


def timed(
    args: argparse.Namespace, specs: list[RequestSpec], rate: float | None
) -> list[RequestSpec]:
    """``specs`` with the arrival times of ``--arrival`` at ``rate``."""
    return with_arrivals(specs, arrivals(args, [s.arrival_s for s in specs], rate))


def timed_conversations(
    args: argparse.Namespace, plans: list[ConversationPlan], rate: float | None
) -> list[ConversationPlan]:
    """``plans`` starting at the arrival times of ``--arrival`` at ``rate`` (conversations
    per second)."""
    return with_starts(plans, arrivals(args, [p.start_s for p in plans], rate))


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
        **(
            {"conversation": conversation_summary(records, server)}
            if any(r.turn >= 0 for r in records)
            else {}
        ),
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


def load_conditions(
    args: argparse.Namespace, workload: opt.Workload, slo: Slo | None
) -> dict[str, Any]:
    """The conditions of the workload, load and SLO (shared with ``kvserve sim serve``)."""
    return {
        "workload": args.workload,
        "num_requests": len(workload.specs)
        if workload.conversations is None
        else sum(p.turns for p in workload.conversations),
        "workload_params": workload.conditions,
        "arrival": opt.arrival_process(args),
        "rates": [opt.json_rate(r) for r in opt.rates(args)],
        "burstiness_cv": args.burstiness_cv,
        "concurrency": args.concurrency,
        "warmup": args.warmup,
        "seed": args.seed,
        "vocab": args.vocab,
        "timeout_s": args.timeout_s,
        "prompt_format": opt.prompt_format(args),
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


OneRate = Callable[[int, float | None], tuple[dict[str, Any], list[RequestRecord]]]
"""``(i, rate) -> (row, records)``: the workload salted with ``i`` run at ``rate`` (None:
all at once) by whatever serves it, as :func:`rate_row`'s row and the requests' records."""


def run_sweep(
    args: argparse.Namespace, one_rate: OneRate, slo: Slo | None, conditions: dict[str, Any]
) -> dict[str, Any]:
    """Every rate of ``--rates`` in turn through ``one_rate``: the sweep's result
    (``conditions``, a row and the records per rate, the attainment points and, with an
    SLO, the goodput sweep), which :func:`report` prints."""
    rows: list[dict[str, Any]] = []
    runs: list[tuple[str, list[RequestRecord]]] = []
    for i, rate in enumerate(opt.rates(args)):
        row, records = one_rate(i, rate)
        rows.append(row)
        runs.append((f"rate {row['rate']}", records))
    points = [sweep_point(row) for row in rows]
    sweep = sweep_goodput(points, args.goodput_threshold) if slo else None
    return {"conditions": conditions, "rows": rows, "sweep": sweep, "runs": runs, "points": points}


def report(bench: str, args: argparse.Namespace, result: dict[str, Any]) -> int:
    """Print :func:`run_sweep`'s ``result`` as the JSON of ``bench`` (``serve``, ``sim
    serve``) and, with ``--out``, write its files (:func:`write_out`); 0."""
    rows, head = results_and_headline(result)
    payload = {
        "bench": bench,
        "conditions": result["conditions"],
        "results": rows,
        "headline": head,
    }
    if args.out is not None:
        full = {**base_conditions(), **result["conditions"]}
        files = write_out(args.out, {**payload, "conditions": full}, result)
        log(f"{command(bench)}: wrote {', '.join(files)}")
    emit(bench, result["conditions"], rows, head)
    return 0

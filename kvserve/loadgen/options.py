"""The flags of ``kvserve bench serve`` and what they build: the workload and its conditions.

Every length, rate, scale and seed is a flag, and :func:`workload_conditions` records each
one that shaped the run in the JSON's ``conditions``.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kvserve.loadgen.arrivals import PROCESSES
from kvserve.loadgen.mooncake_trace import SHIPPED, load_trace
from kvserve.loadgen.slo import AbsoluteSlo, SloTargets
from kvserve.loadgen.workloads import (
    DEFAULT_VOCAB,
    SYNTHETIC_KINDS,
    Lengths,
    RequestSpec,
    SyntheticShape,
    TraceOptions,
    shared_prefix_requests,
    synthetic_requests,
    trace_requests,
)

WORKLOADS = (*SYNTHETIC_KINDS, "shared-prefix", "trace")
DEFAULT_REQUESTS = 48


def add_workload_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", choices=WORKLOADS, default="mixed")
    p.add_argument(
        "--num-requests",
        "--max-requests",
        dest="num_requests",
        type=int,
        default=0,
        help=f"requests per rate (default {DEFAULT_REQUESTS}; for trace: the first N, 0 = all)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vocab", type=int, default=DEFAULT_VOCAB, help="token ids in [100, vocab)")
    p.add_argument("--spread", type=float, default=0.25, help="lengths uniform in mean*(1±s)")
    p.add_argument("--prefill-heavy-input", type=int, default=512)
    p.add_argument("--prefill-heavy-output", type=int, default=16)
    p.add_argument("--decode-heavy-input", type=int, default=64)
    p.add_argument("--decode-heavy-output", type=int, default=128)
    p.add_argument("--prefix-groups", type=int, default=4, help="shared-prefix: groups G")
    p.add_argument("--prefix-len", type=int, default=256, help="shared-prefix: prefix tokens P")
    p.add_argument("--suffix-len", type=int, default=32, help="shared-prefix: unique suffix")
    p.add_argument("--prefix-output-len", type=int, default=16, help="shared-prefix: output")
    p.add_argument(
        "--trace",
        type=Path,
        default=SHIPPED,
        help="Mooncake trace, JSON lines, plain or .gz (default: the shipped Mooncake trace)",
    )
    p.add_argument("--trace-block-size", type=int, default=512, help="tokens per hash id")
    p.add_argument("--length-scale", type=float, default=1.0, help="trace: prompt lengths x")
    p.add_argument("--output-scale", type=float, default=1.0, help="trace: output lengths x")
    p.add_argument("--output-cap", type=int, default=0, help="trace: output cap (0: none)")


def add_load_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--arrival", choices=PROCESSES, default=None, help="default: trace or poisson")
    p.add_argument(
        "--rates",
        type=float,
        nargs="+",
        default=None,
        help="request rates to sweep (req/s, 'inf' = all at once); trace arrivals are "
        "rescaled to each rate (default: trace timing, or inf)",
    )
    p.add_argument("--burstiness-cv", type=float, default=1.0, help="gamma: CV of gaps")
    p.add_argument("--time-scale", type=float, default=1.0, help="trace timestamps x")
    p.add_argument("--concurrency", type=int, default=0, help="requests in flight cap (0: none)")
    p.add_argument("--warmup", type=int, default=2, help="warm-up requests (not counted)")
    p.add_argument("--timeout-s", type=float, default=300.0, help="per-request timeout")
    p.add_argument("--prompt-format", choices=["ids", "text"], default="ids")
    p.add_argument("--tokenizer", default="", help="text prompts: HF tokenizer to decode with")
    p.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True)


def add_report_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--slo-ttft-s", type=float, default=None)
    p.add_argument("--slo-tpot-s", type=float, default=None)
    p.add_argument("--slo-tbt-s", type=float, default=None)
    p.add_argument(
        "--slo-relative",
        type=float,
        nargs=2,
        metavar=("TTFT_FACTOR", "TBT_FACTOR"),
        default=None,
        help="targets = factor x median unloaded TTFT/TBT per input-length bucket",
    )
    p.add_argument("--calibration-requests", type=int, default=8, help="for --slo-relative")
    p.add_argument("--goodput-threshold", type=float, default=0.9)
    p.add_argument("--input-buckets", type=int, nargs="+", default=[128, 512, 2048])
    p.add_argument("--output-buckets", type=int, nargs="+", default=[32, 128])
    p.add_argument("--deployment", nargs="*", default=[], metavar="KEY=VALUE")
    p.add_argument("--out", type=Path, default=None, help="folder for the JSON and PNG plots")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Every flag of ``kvserve bench serve``."""
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="server base URL")
    parser.add_argument("--model", default="", help="default: the first of /v1/models")
    add_workload_arguments(parser)
    add_load_arguments(parser)
    add_report_arguments(parser)


@dataclass(frozen=True)
class Workload:
    """The requests of one rate (arrivals unset unless replayed from a trace)."""

    specs: list[RequestSpec]
    conditions: dict[str, Any]


def build_workload(args: argparse.Namespace) -> Workload:
    """The workload the flags describe, with the conditions that shaped it."""
    n = args.num_requests or DEFAULT_REQUESTS
    spread = args.spread
    if args.workload in SYNTHETIC_KINDS:
        shapes = {
            "prefill-heavy": SyntheticShape(
                Lengths(args.prefill_heavy_input, spread),
                Lengths(args.prefill_heavy_output, spread),
            ),
            "decode-heavy": SyntheticShape(
                Lengths(args.decode_heavy_input, spread), Lengths(args.decode_heavy_output, spread)
            ),
        }
        specs = synthetic_requests(args.workload, n, args.seed, shapes, args.vocab)
        return Workload(specs, {"shapes": {k: asdict(v) for k, v in shapes.items()}})
    if args.workload == "shared-prefix":
        suffix, output = Lengths(args.suffix_len, spread), Lengths(args.prefix_output_len, spread)
        specs = shared_prefix_requests(
            n, args.seed, args.prefix_groups, args.prefix_len, suffix, output, args.vocab
        )
        return Workload(
            specs,
            {
                "groups": args.prefix_groups,
                "prefix_len": args.prefix_len,
                "suffix": asdict(suffix),
                "output": asdict(output),
            },
        )
    opts = TraceOptions(
        args.trace_block_size,
        args.length_scale,
        args.output_scale,
        args.output_cap,
        args.num_requests,
    )
    specs = trace_requests(load_trace(args.trace), args.seed, opts, args.vocab)
    return Workload(
        specs, {"trace": str(args.trace), **asdict(opts), "time_scale": args.time_scale}
    )


def arrival_process(args: argparse.Namespace) -> str:
    return str(args.arrival or ("trace" if args.workload == "trace" else "poisson"))


def rates(args: argparse.Namespace) -> list[float | None]:
    """The rates to run: the flags', or one run (None: trace timing; else inf)."""
    if args.rates:
        return list(args.rates)
    return [None] if arrival_process(args) == "trace" else [math.inf]


def absolute_slo(args: argparse.Namespace) -> AbsoluteSlo | None:
    targets = SloTargets(args.slo_ttft_s, args.slo_tpot_s, args.slo_tbt_s)
    return AbsoluteSlo(targets) if targets != SloTargets() else None


def deployment_labels(pairs: list[str]) -> dict[str, str]:
    labels = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--deployment takes KEY=VALUE pairs, got {pair!r}")
        labels[key] = value
    return labels


def json_rate(rate: float | None) -> float | str | None:
    """A rate as JSON can carry it (``"inf"`` for all at once)."""
    return "inf" if rate is not None and math.isinf(rate) else rate

"""``kvserve sim crossover``: the link bandwidth below which disaggregation costs TTFT.

For each prompt length ``L`` (a cost from :mod:`kvserve.sim.analysis_common`):

1. colocated TTFT: the prompt is prefilled in chunks of ``--chunk-tokens`` and every chunk's
   step also carries ``--decode-batch`` decodes at context ``--decode-context`` (the
   interference a mixed worker's prompt suffers);
2. prefill alone: the same chunks without decodes; ``interference = colocated - alone``;
3. disaggregated TTFT at bandwidth ``B``: ``alone + exposed(B)``, the exposed KV transfer of
   ``kv_bytes_per_token x L`` over a :class:`~kvserve.sim.link.Link` (``--latency-us``):
   without streaming the whole transfer (``latency + bytes / B``); with layer-wise streaming
   the pipeline of :func:`~kvserve.sim.link.pipelined_exposed_s` over every (chunk, layer)
   stage in order, each of ``chunk step / layers`` compute and ``chunk KV / layers`` bytes
   (so the KV of early chunks travels while later chunks compute);
4. crossover ``B*(L)``: disaggregation wins iff ``exposed(B) < interference``; ``exposed``
   falls with ``B``, so ``B*`` is found by bisection in log space over ``[--min-gbps,
   --max-gbps]``. ``null`` when there is no crossover in the range, with the verdict
   ``never_wins`` (even ``--max-gbps`` exposes more than the interference) or ``always_wins``
   (even ``--min-gbps`` exposes less).

What must hold (tested): streaming exposes no more than sending after the prefill at every
``B``, so ``B*_streaming <= B*_no_streaming``; without streaming and latency,
``B* = kv_bytes / interference``. Print the JSON; with ``--out``, ``crossover.png``.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from kvserve.report import emit, log
from kvserve.settings import setting
from kvserve.sim import SIM_ENV
from kvserve.sim.analysis_common import (
    GB,
    CostConfig,
    CostSetup,
    chunk_shapes,
    cost_setup,
    steps_s,
)
from kvserve.sim.link import Link, pipelined_exposed_s

REFERENCE_LINKS_GBPS: dict[str, float] = {
    "25 GbE TCP": 25 / 8,
    "100 Gb RDMA": 100 / 8,
    "400 Gb RDMA": 400 / 8,
    "NVLink (H100, one way)": 450.0,
}
"""Common links, GB/s, for the plot's reference lines and the headline's target."""


@dataclass(frozen=True)
class CrossoverConfig:
    """The prompts, batch and links of ``kvserve sim crossover``.

    - ``lengths``: prompt lengths, one crossover each;
    - ``chunk_tokens``: prefill chunk tokens (0: one step);
    - ``decode_batch``: sequences decoding alongside the prefill;
    - ``decode_context``: context tokens of each of them;
    - ``min_gbps`` / ``max_gbps``: the link bandwidths searched, GB/s.
    """

    env_prefix: ClassVar[str] = SIM_ENV
    lengths: list[int] = setting([512 * 2**i for i in range(9)])
    chunk_tokens: int = 2048
    decode_batch: int = 64
    decode_context: int = 2048
    min_gbps: float = 0.01
    max_gbps: float = 10_000.0


SETTINGS = (CrossoverConfig, CostConfig)


def crossover_gbps(
    exposed_s: Callable[[float], float], budget_s: float, lo: float, hi: float
) -> tuple[float | None, str]:
    """The bandwidth (GB/s) at which ``exposed_s(gbps)`` (non-increasing) equals
    ``budget_s``, by log-space bisection in ``[lo, hi]``; ``(None, verdict)`` without one."""
    if exposed_s(hi) >= budget_s:
        return None, "never_wins"
    if exposed_s(lo) < budget_s:
        return None, "always_wins"
    while hi / lo > 1 + 1e-9:
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if exposed_s(mid) < budget_s else (mid, hi)
    return math.sqrt(lo * hi), "crossover"


def length_row(setup: CostSetup, length: int, args: argparse.Namespace) -> dict[str, Any]:
    """Steps 1-4 for one prompt length."""
    alone_shapes = chunk_shapes(length, args.chunk_tokens)
    alone = steps_s(setup.cost, alone_shapes)
    decode = (args.decode_context,) * args.decode_batch
    colocated = sum(steps_s(setup.cost, chunk_shapes(length, args.chunk_tokens, decode)))
    interference = colocated - sum(alone)
    layers = setup.model.layers
    stages = [
        (step / layers, setup.kv_bytes(shape.prefill_tokens) / layers)
        for step, shape in zip(alone, alone_shapes, strict=True)
        for _ in range(layers)
    ]
    kv_bytes = setup.kv_bytes(length)
    latency = args.latency_us * 1e-6

    def streaming(gbps: float) -> float:
        return pipelined_exposed_s(stages, Link(gbps * GB, latency))

    def after(gbps: float) -> float:
        return Link(gbps * GB, latency).transfer_s(kv_bytes)

    b_stream, v_stream = crossover_gbps(streaming, interference, args.min_gbps, args.max_gbps)
    b_after, v_after = crossover_gbps(after, interference, args.min_gbps, args.max_gbps)
    return {
        "prompt_len": length,
        "chunks": len(alone_shapes),
        "kv_bytes": kv_bytes,
        "prefill_alone_s": sum(alone),
        "colocated_ttft_s": colocated,
        "interference_s": interference,
        "crossover_gbps_streaming": b_stream,
        "crossover_gbps_no_streaming": b_after,
        "streaming_verdict": v_stream,
        "no_streaming_verdict": v_after,
    }


def headline(rows: list[dict[str, Any]], setup: CostSetup) -> dict[str, Any]:
    top = max(rows, key=lambda r: r["prompt_len"])
    value, baseline = top["crossover_gbps_streaming"], top["crossover_gbps_no_streaming"]
    tcp = "25 GbE TCP"
    return {
        "metric": (
            f"link GB/s below which disaggregation costs more TTFT than colocated chunked "
            f"prefill, {setup.model.name} on {setup.cost_name}, {top['prompt_len']}-token "
            "prompt, with layer-wise streaming (baseline: without)"
        ),
        "prompt_len": top["prompt_len"],
        "value": value,
        "baseline": baseline,
        "ratio": baseline / value if value and baseline else None,
        "target": REFERENCE_LINKS_GBPS[tcp],
        "target_meaning": f"{tcp}: disaggregation over it pays off where value <= target",
        "verdicts": [top["streaming_verdict"], top["no_streaming_verdict"]],
    }


def plot(rows: list[dict[str, Any]], path: Any) -> None:
    from kvserve.loadgen.plots import pyplot, save

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = [r["prompt_len"] for r in rows]
    for key, label in (
        ("crossover_gbps_streaming", "layer-wise streaming"),
        ("crossover_gbps_no_streaming", "send after prefill"),
    ):
        ys = [math.nan if r[key] is None else r[key] for r in rows]
        ax.plot(xs, ys, "o-", label=label)
    for i, (name, gbps) in enumerate(REFERENCE_LINKS_GBPS.items()):
        ax.axhline(gbps, color=f"C{i + 2}", linestyle="--", linewidth=0.8)
        ax.annotate(name, (xs[0], gbps), fontsize=7, va="bottom", color=f"C{i + 2}")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="prompt length (tokens)",
        ylabel="crossover bandwidth B* (GB/s)",
        title="disaggregation wins above the line",
    )
    ax.legend(fontsize=8)
    save(fig, path)


def run(args: argparse.Namespace) -> int:
    if not 0 < args.min_gbps < args.max_gbps:
        raise ValueError(f"need 0 < --min-gbps < --max-gbps, got {args.min_gbps}, {args.max_gbps}")
    if args.decode_batch < 0 or args.decode_context < 0:
        raise ValueError("--decode-batch and --decode-context must be >= 0")
    setup = cost_setup(args)
    rows = []
    for length in sorted(args.lengths):
        rows.append(length_row(setup, length, args))
        log(f"crossover: L={length} B*={rows[-1]['crossover_gbps_streaming']} GB/s (streaming)")
    if args.out is not None:
        plot(rows, args.out / "crossover.png")
    conditions = {
        **setup.conditions(),
        "lengths": sorted(args.lengths),
        "chunk_tokens": args.chunk_tokens,
        "decode_batch": args.decode_batch,
        "decode_context": args.decode_context,
        "latency_us": args.latency_us,
        "search_gbps": [args.min_gbps, args.max_gbps],
    }
    emit("sim crossover", conditions, rows, headline(rows, setup))
    return 0

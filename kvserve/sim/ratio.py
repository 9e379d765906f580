"""``kvserve sim ratio``: SLO attainment and goodput of every P:D split of ``--instances``
instances, for workloads from prompt-heavy to answer-heavy: where the feasible band lies
and how it moves.

1. Each mix ``INPUT:OUTPUT`` (``--mixes``) is ``--num-requests`` synthetic requests whose
   prompt and answer lengths are uniform in ``mean x [1 - spread, 1 + spread]``; the same
   requests (seeded by ``--seed`` and the mix's position) serve every split and rate.
2. Each split ``p`` prefill + ``N - p`` decode instances, ``p = 1 .. N-1`` (and, with
   ``--colocated``, ``N`` mixed instances, the baseline), is swept over ``--rates``
   (requests per second offered to the whole cluster, Poisson arrivals seeded by
   ``--seed``: every split sees the same arrival times at a rate). Each (mix, split, rate) is
   a fresh simulated cluster (:func:`kvserve.sim.deploy.build`; ``--workers`` is replaced by
   the split) that serves the requests once; a request attains the SLO when it succeeds
   with TTFT <= ``--slo-ttft-s`` and TPOT <= ``--slo-tpot-s``. Attainment is taken to fall
   as the rate rises, so the first rate below ``--goodput-threshold`` is found by bisection
   over the sorted rates (:func:`first_failing`, at most ``ceil(log2(rates + 1))`` runs):
   rates below it pass, the rest fail (``passing_by_rate`` is read that way).
3. Goodput of a split (:func:`kvserve.loadgen.slo.sweep_goodput` on the points run):
   the rate, interpolated between the last passing and the first failing rate, where
   attainment falls to the threshold; 0 when the lowest rate fails; the highest rate (a
   lower bound, ``goodput_lower_bound``) when every rate passes.
4. Per mix (:func:`best_and_band`): the best split is the disaggregated split of highest
   goodput (ties: fewer prefill instances); the "green band" is every disaggregated split
   whose goodput is at least ``--band-share`` (0.9) of the best's.

Each run is a finite burst of ``--num-requests`` requests, not a steady state: goodput here
is the highest rate at which such a burst is served within the SLO. Every engine step is one
simulated event, so the run time grows with requests x answer length.

Defaults, for llama3-8b on one H100 per instance (``--cost roofline:h100:llama3-8b``):

- SLO: TTFT 2 s, about 8x the unloaded prefill of the longest default prompt (8192 tokens,
  ~0.24 s; Mooncake's relative SLO takes 10x), and TPOT 30 ms, about 5x the unloaded decode
  step (~6.7 ms; Mooncake's TBT factor), i.e. ~33 tokens/s per user;
- engine: the device's memory for the KV (``--kv-cache-mib 0``: 90% less the weights, ~437k
  tokens), a 2048-token step budget (chunked prefill on mixed instances, as vLLM on a large
  GPU) and 256 sequences (vLLM's);
- the ``round_robin`` router policy: the requests of a mix are alike, and the load view
  that ``cache_aware`` ranks by is up to ``--heartbeat-s`` old, so it herds a burst onto
  one worker and the sweep would measure the policy rather than the split;
- mixes ``8192:32`` to ``512:512`` (input/output from 256 down to 1), 128 requests each and
  rates 2..128 req/s (7 rates: 3 runs per split): about 2 minutes on one CPU core.

At that scale an 8B model's decode instance holds hundreds of sequences and its step stays
under the TPOT SLO even with a full cache (~28 ms), so a burst of 128 requests never fills
the decode side: on answer-heavy mixes every split with enough prefill passes every rate
(a wide band of lower bounds, the best being the fewest prefill instances that do). To see
decode bind, scale the KV down (``--kv-cache-mib 4096``): a decode instance reserves the
prompt's pages before its prefill starts, and a reservation that finds no decode pages is
a 503, so memory pressure costs disaggregation failed requests where mixed instances queue.

Print the JSON (rows per mix and split; the headline compares the best split with the
colocated baseline on the most prompt-heavy mix); with ``--out``, ``ratio.png``
(:mod:`kvserve.sim.ratio_plot`).
"""

from __future__ import annotations

import argparse
import copy
import time
from collections.abc import Callable, Sequence
from typing import Any

from kvserve.cluster.deployment import parse_deployment
from kvserve.loadgen.arrivals import poisson_arrivals
from kvserve.loadgen.metrics import span_s, summarize
from kvserve.loadgen.slo import AbsoluteSlo, SloTargets, sweep_goodput
from kvserve.loadgen.workloads import (
    Lengths,
    RequestSpec,
    SyntheticShape,
    synthetic_requests,
    with_arrivals,
)
from kvserve.report import emit, log
from kvserve.sim import deploy
from kvserve.sim.ratio_settings import Mix, add_arguments, parse_mix

__all__ = ["Mix", "add_arguments", "best_and_band", "first_failing", "parse_mix", "run", "splits"]


def splits(instances: int, colocated: bool) -> list[str]:
    """``1p{N-1}d .. {N-1}p1d``, then ``{N}m`` with the baseline."""
    names = [f"{p}p{instances - p}d" for p in range(1, instances)]
    return names + ([f"{instances}m"] if colocated else [])


def best_and_band(
    goodputs: Sequence[tuple[str, float | None]], share: float
) -> tuple[str | None, list[str]]:
    """The best of ``(split, goodput)`` pairs (highest goodput; ties: the earliest listed)
    and the band: every split whose goodput is >= ``share`` x the best's, in the given order.
    None goodputs count as 0; no positive goodput gives ``(None, [])``."""
    scored = [(name, g or 0.0) for name, g in goodputs]
    if not scored or max(g for _, g in scored) <= 0:
        return None, []
    top = max(g for _, g in scored)
    best = next(name for name, g in scored if g == top)
    return best, [name for name, g in scored if g >= share * top]


def mix_requests(mix: Mix, args: argparse.Namespace, index: int) -> list[RequestSpec]:
    shape = SyntheticShape(Lengths(mix.input, args.spread), Lengths(mix.output, args.spread))
    kind = "prefill-heavy"  # one shape, under any name
    return synthetic_requests(kind, args.num_requests, args.seed + index, {kind: shape})


def point(
    args: argparse.Namespace, workers: str, specs: list[RequestSpec], slo: AbsoluteSlo
) -> dict[str, Any]:
    """One fresh cluster of ``workers`` serving ``specs``: attainment and p90 latencies."""
    split_args = copy.copy(args)
    split_args.workers = workers
    cluster, _ = deploy.build(split_args)
    records = cluster.run(specs)
    s = summarize(records, span_s(records), slo.meets)
    return {"attainment": s.slo_attainment, "completed": s.completed,
            "ttft_p90_s": s.ttft_s.p90, "tpot_p90_s": s.tpot_s.p90}  # fmt: skip


def first_failing(passes: Callable[[int], bool], n: int) -> int:
    """The smallest index ``i`` in ``range(n)`` with ``not passes(i)`` (``n`` if none), by
    bisection, assuming a failing index is followed only by failing ones (attainment falls
    as the rate rises); calls ``passes`` at most ``ceil(log2(n + 1))`` times."""
    lo, hi = -1, n  # passes(lo) and not passes(hi), as if evaluated
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if passes(mid) else (lo, mid)
    return hi


def split_row(
    args: argparse.Namespace, mix: Mix, workers: str, specs: list[RequestSpec], slo: AbsoluteSlo
) -> dict[str, Any]:
    """Steps 2-3 for one (mix, split): its points (in rate order) and goodput."""
    rates = args.rates
    points: dict[float, dict[str, Any]] = {}

    def passes(i: int) -> bool:
        timed = with_arrivals(specs, poisson_arrivals(len(specs), rates[i], args.seed))
        points[rates[i]] = {"rate": rates[i], **point(args, workers, timed, slo)}
        return bool((points[rates[i]]["attainment"] or 0.0) >= args.goodput_threshold)

    first_fail = first_failing(passes, len(rates))
    sweep = sweep_goodput([(r, p["attainment"]) for r, p in points.items()],
                          args.goodput_threshold)  # fmt: skip
    prefill, decode, _ = parse_deployment(workers)
    return {"mix": mix.label, "input": mix.input, "output": mix.output, "workers": workers,
            "prefill": prefill, "decode": decode, "colocated": prefill == 0,
            "goodput_rps": sweep.interpolated_rate or 0.0,
            "goodput_lower_bound": first_fail == len(rates),
            "highest_passing_rate": rates[first_fail - 1] if first_fail else None,
            "first_failing_rate": rates[first_fail] if first_fail < len(rates) else None,
            "points": [points[r] for r in sorted(points)]}  # fmt: skip


def mix_summary(rows: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """Step 4 for one mix's rows (marks ``in_band``, ``best``, ``relative_goodput``)."""
    disagg = [r for r in rows if not r["colocated"]]
    best, band = best_and_band([(r["workers"], r["goodput_rps"]) for r in disagg],
                               args.band_share)  # fmt: skip
    top = max((r["goodput_rps"] for r in disagg), default=0.0)
    for r in rows:
        r["best"], r["in_band"] = r["workers"] == best, r["workers"] in band
        r["relative_goodput"] = r["goodput_rps"] / top if top else None
    colocated = next((r["goodput_rps"] for r in rows if r["colocated"]), None)
    passing = {
        str(rate): [r["workers"] for r in rows
                    if r["first_failing_rate"] is None or rate < r["first_failing_rate"]]
        for rate in args.rates
    }  # fmt: skip
    bounds = {r["workers"]: r["goodput_lower_bound"] for r in rows}
    return {"mix": rows[0]["mix"], "best": best, "best_goodput_rps": top or None, "band": band,
            "best_is_lower_bound": bounds.get(str(best)),
            "colocated_goodput_rps": colocated,
            "best_over_colocated": top / colocated if colocated else None,
            "passing_by_rate": passing}  # fmt: skip


def headline(summaries: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    first = summaries[0]
    n = args.instances
    return {
        "metric": (
            f"goodput (req/s at >= {args.goodput_threshold:.0%} SLO attainment, TTFT <= "
            f"{args.slo_ttft_s} s, TPOT <= {args.slo_tpot_s} s) of the best P:D split of {n} "
            f"instances for the most prompt-heavy mix {first['mix']} (baseline: {n} colocated "
            "instances); best_by_mix shows how the best split moves as answers grow"
        ),
        "value": first["best_goodput_rps"],
        "baseline": first["colocated_goodput_rps"],
        "ratio": first["best_over_colocated"],
        "target": 1.0,
        "target_meaning": "ratio > 1: the best disaggregated split beats colocation",
        "lower_bounds": "a goodput equal to the highest rate passed every rate (see by_mix)",
        "best_by_mix": {s["mix"]: s["best"] for s in summaries},
        "band_by_mix": {s["mix"]: s["band"] for s in summaries},
        "band_definition": f"disaggregated splits with goodput >= {args.band_share:.0%} of "
        "the mix's best",
        "by_mix": summaries,
    }


def check(args: argparse.Namespace) -> None:
    if args.instances < 2:
        raise ValueError(f"--instances must be >= 2 to split, got {args.instances}")
    if args.num_requests < 1 or min(args.rates) <= 0 or not 0 < args.band_share <= 1:
        raise ValueError("need --num-requests >= 1, --rates > 0 and 0 < --band-share <= 1")


def run(args: argparse.Namespace) -> int:
    check(args)
    args.rates = sorted(set(args.rates))
    slo = AbsoluteSlo(SloTargets(ttft_s=args.slo_ttft_s, tpot_s=args.slo_tpot_s))
    names = splits(args.instances, args.colocated)
    rows: list[dict[str, Any]] = []
    summaries = []
    started = time.perf_counter()
    for i, mix in enumerate(args.mixes):
        specs = mix_requests(mix, args, i)
        mine = [split_row(args, mix, workers, specs, slo) for workers in names]
        summaries.append(mix_summary(mine, args))
        rows += mine
        log(f"sim ratio: {mix.label}: best {summaries[-1]['best']}, band "
            f"{summaries[-1]['band']} ({time.perf_counter() - started:.0f} s)")  # fmt: skip
    _, deployment = deploy.build(copy.copy(args))
    conditions = {
        "instances": args.instances,
        "splits": names,
        "mixes": [m.label for m in args.mixes],
        "spread": args.spread,
        "rates": args.rates,
        "num_requests": args.num_requests,
        "seed": args.seed,
        "arrival": "poisson",
        "slo": slo.to_json(),
        "goodput_threshold": args.goodput_threshold,
        "band_share": args.band_share,
        "sweep": "bisection for each split's first failing rate (attainment taken to fall "
        "with the rate)",
        "deployment": {k: v for k, v in deployment.items() if k != "workers"},
        "wall_s": time.perf_counter() - started,
    }
    if args.out is not None:
        from kvserve.sim.ratio_plot import plot

        plot(rows, [m.label for m in args.mixes], args.instances, args.out / "ratio.png")
    emit("sim ratio", conditions, rows, headline(summaries, args))
    return 0

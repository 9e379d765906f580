"""``kvserve bench index`` (also ``python -m kvserve.bench.index_timing``): how long the
router's prefix index takes to answer where a prompt's prefix is cached.

In one process, no server: ``--workers`` workers each hold ``--held`` blocks (256-bit names,
applied as the router applies a worker's snapshot, in random order), worker ``i`` the first
``(i+1)/workers`` of a chain of ``--prompt-blocks`` names (the last worker all of it: the
walk never stops early). Each of ``--repeats`` rounds asks the chain as new int objects, as
the router computes it per request, and times:

- :meth:`~router.placement.prefix_index.PrefixIndex.matched_all`, the router's one pass for
  every worker (wall time, and this thread's CPU time, which leaves out other processes);
- :meth:`~router.placement.prefix_index.PrefixIndex.matched` once per worker, one walk each
  (the baseline, same run).

Between two questions every worker is asked once more, so the caches are not warm. Each
answer is checked against the chain each worker was given (a wrong one ends the run).
Medians; one JSON object (:func:`kvserve.report.emit`).
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import dataclass
from typing import ClassVar

from kvserve.bench.common import ratio_headline
from kvserve.report import emit, median
from kvserve.settings import BENCH_ENV
from proto.kv_events import EventBatch, Stored
from router.placement.prefix_index import PrefixIndex

SNAPSHOT_PART = 4096
"""Names per snapshot part, as the workers send them."""


@dataclass(frozen=True)
class IndexBenchConfig:
    """What ``kvserve bench index`` times.

    - ``workers``: workers known to the index;
    - ``held``: blocks each worker holds;
    - ``prompt_blocks``: blocks in the prompt's chain (2048: a 32k-token prompt of 16-token
      blocks);
    - ``repeats``: questions timed (the median is reported);
    - ``seed``: seed of the names.
    """

    env_prefix: ClassVar[str] = BENCH_ENV
    workers: int = 4
    held: int = 100_000
    prompt_blocks: int = 2048
    repeats: int = 300
    seed: int = 0


SETTINGS = (IndexBenchConfig,)


def filled(config: argparse.Namespace) -> tuple[PrefixIndex, list[int], dict[str, int]]:
    """The index of the module docstring, the chain, and each worker's true answer."""
    if not 0 < config.prompt_blocks <= config.held or config.workers < 1:
        raise SystemExit("bench index: needs workers >= 1 and 0 < prompt-blocks <= held")
    rng = random.Random(config.seed)
    chain = [rng.getrandbits(256) for _ in range(config.prompt_blocks)]
    index, truth = PrefixIndex(), {}
    for i in range(config.workers):
        worker_id, count = f"w{i}", config.prompt_blocks * (i + 1) // config.workers
        mine = chain[:count] + [rng.getrandbits(256) for _ in range(config.held - count)]
        rng.shuffle(mine)
        for part, start in enumerate(range(0, len(mine), SNAPSHOT_PART)):
            events = tuple(Stored(h, 0) for h in mine[start : start + SNAPSHOT_PART])
            final = start + SNAPSHOT_PART >= len(mine)
            index.apply(EventBatch(worker_id, 1.0, part, events, True, part, final))
        truth[worker_id] = count
    return index, chain, truth


def time_questions(config: argparse.Namespace) -> dict[str, list[float]]:
    """Seconds of each question, ``repeats`` of each kind (module docstring)."""
    index, chain, truth = filled(config)
    times: dict[str, list[float]] = {"all_wall": [], "all_cpu": [], "each_wall": []}
    for _ in range(config.repeats):
        query = [int.from_bytes(h.to_bytes(32, "big"), "big") for h in chain]
        for worker_id in truth:  # other work between two questions: the caches are not warm
            index.matched(worker_id, query)
        t0, c0 = time.perf_counter(), time.thread_time()
        together = index.matched_all(query)
        c1, t1 = time.thread_time(), time.perf_counter()
        each = {worker_id: index.matched(worker_id, query) for worker_id in truth}
        times["each_wall"].append(time.perf_counter() - t1)
        times["all_wall"].append(t1 - t0)
        times["all_cpu"].append(c1 - c0)
        if together != truth or each != truth:
            raise RuntimeError(f"the index answered {together} and {each}, not {truth}")
    return times


def run(args: argparse.Namespace) -> int:
    times = time_questions(args)
    us = {kind: round(median(values) * 1e6, 1) for kind, values in times.items()}
    rows = [
        {"what": "matched_all, wall", "us": us["all_wall"]},
        {"what": "matched_all, this thread's CPU", "us": us["all_cpu"]},
        {"what": "matched_all, wall, fastest", "us": round(min(times["all_wall"]) * 1e6, 1)},
        {"what": "matched once per worker, wall (baseline)", "us": us["each_wall"]},
    ]
    metric = "matched_all over one matched per worker (median wall time)"
    emit(
        "index",
        {
            "workers": args.workers,
            "held_blocks_per_worker": args.held,
            "prompt_blocks": args.prompt_blocks,
            "repeats": args.repeats,
            "statistic": "median",
            "names": "256-bit, asked as new int objects",
        },
        rows,
        ratio_headline(metric, us["all_wall"], us["each_wall"], digits=3),
    )
    return 0


if __name__ == "__main__":  # python -m kvserve.bench.index_timing: the defaults
    raise SystemExit(run(argparse.Namespace(**vars(IndexBenchConfig()))))

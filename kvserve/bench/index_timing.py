"""How long the router's prefix index takes to answer, as
``python -m kvserve.bench.index_timing``: 4 workers of 100k blocks each, a 2048-block chain
(a 32k-token prompt of 16-token blocks). Prints the medians in microseconds."""

from __future__ import annotations

import random
import statistics
import time

from proto.kv_events import EventBatch, Stored
from router.placement.prefix_index import PrefixIndex


def time_query(
    workers: int = 4, held: int = 100_000, prompt_blocks: int = 2048, repeats: int = 300
) -> dict[str, float]:
    """Seconds of one :meth:`PrefixIndex.matched_all` (wall-clock median and min; the
    median of this thread's CPU time, which leaves out time taken by other processes) and
    of :meth:`matched` for every worker, for a chain of ``prompt_blocks`` 256-bit
    names, each worker holding ``held`` blocks, stored in random order: worker ``i`` holds
    the first ``(i+1)/workers`` of the chain (the last all of it: the walk never stops
    early). The chain is asked as new int objects, as the router computes it."""
    rng = random.Random(0)
    chain = [rng.getrandbits(256) for _ in range(prompt_blocks)]
    index = PrefixIndex()
    for i in range(workers):
        mine = chain[: prompt_blocks * (i + 1) // workers]
        mine += [rng.getrandbits(256) for _ in range(held - len(mine))]
        rng.shuffle(mine)
        for part, start in enumerate(range(0, len(mine), 4096)):
            events = tuple(Stored(h, 0) for h in mine[start : start + 4096])
            final = start + 4096 >= len(mine)
            index.apply(EventBatch(f"w{i}", 1.0, part, events, True, part, final))
    query = [int.from_bytes(h.to_bytes(32, "big"), "big") for h in chain]
    ids = [f"w{i}" for i in range(workers)]
    wall: list[float] = []
    cpu: list[float] = []
    each: list[float] = []
    for _ in range(repeats):
        for worker_id in ids:  # other work between two questions: the caches are not warm
            index.matched(worker_id, query)
        t0, c0 = time.perf_counter(), time.thread_time()
        index.matched_all(query)
        c1, t1 = time.thread_time(), time.perf_counter()
        for worker_id in ids:
            index.matched(worker_id, query)
        each.append(time.perf_counter() - t1)
        wall.append(t1 - t0)
        cpu.append(c1 - c0)
    return {
        "matched_all wall median": statistics.median(wall),
        "matched_all cpu median": statistics.median(cpu),
        "matched_all wall min": min(wall),
        "matched x workers wall median": statistics.median(each),
    }


if __name__ == "__main__":  # python -m kvserve.bench.index_timing
    print("4 workers x 100k blocks, a 2048-block chain:")
    for name, seconds in time_query().items():
        print(f"  {name}: {seconds * 1e6:.0f} us")

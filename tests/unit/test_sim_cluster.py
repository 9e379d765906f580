"""The simulator on hand-checkable cases: a cost of one second per step, known hops."""

from __future__ import annotations

import pytest

from kvserve.loadgen.workloads import RequestSpec
from kvserve.sim.cluster import SimCluster
from kvserve.sim.costs import StepShape
from kvserve.sim.engine import SIM_HASHER, KVCosts, SimEngine, SimPool, shape_of
from kvserve.sim.link import Link
from kvserve.sim.request import Timing
from router.control.ratio import RatioConfig, RatioController
from router.placement.policies import make_policy
from workers.core.scheduler import Scheduler, SchedulerConfig
from workers.core.sequence import SamplingParams, Sequence

HOP = 0.01
FAST = KVCosts(bytes_per_token=1.0, layers=4, link=Link(1e15))


class PerStep:
    """One second per step, whatever the batch."""

    def step_s(self, shape: StepShape) -> float:
        return 1.0 if shape.num_seqs else 0.0


def engines(roles: str, blocks: int = 256, pool: SimPool | None = None) -> list[SimEngine]:
    config = SchedulerConfig(
        num_blocks=blocks, block_tokens=4, max_model_len=2048, max_num_batched_tokens=512
    )
    pool = pool or SimPool()
    return [
        SimEngine(
            f"{role}{i}",
            {"p": "prefill", "d": "decode", "m": "mixed"}[role],
            config,
            PerStep(),
            FAST,
            pool,
        )
        for i, role in enumerate(roles)
    ]


def spec(index: int, prompt: list[int], max_tokens: int, at: float = 0.0) -> RequestSpec:
    return RequestSpec(index, at, tuple(prompt), max_tokens)


def cluster(roles: str, threshold: int = 8, **kw: object) -> SimCluster:
    return SimCluster(engines(roles), make_policy("round_robin", threshold), Timing(HOP), **kw)  # type: ignore[arg-type]


def test_shape_of_a_mixed_batch_names_decodes_and_prefill_chunks() -> None:
    config = SchedulerConfig(
        num_blocks=16, block_tokens=4, max_model_len=2048, max_num_batched_tokens=8
    )
    sched = Scheduler(config, SIM_HASHER)
    long, short = (
        Sequence(n, list(range(100, 100 + k)), SamplingParams())
        for n, k in (("long", 12), ("short", 3))
    )
    sched.add(short)
    sched.update(sched.schedule())  # short: 3 prompt tokens computed
    short.token_ids.append(7)
    sched.add(long)
    batch = sched.schedule()
    assert shape_of(batch) == StepShape(prefill=((7, 0),), decode=(3,))


def test_local_request_on_a_mixed_worker_times_exactly() -> None:
    records = cluster("m").run([spec(0, list(range(100, 110)), 3)])
    (r,) = records
    # arrive 0; hop to the worker; steps of 1 s make tokens; each reaches the client a hop later
    assert r.chunk_times_s == pytest.approx((HOP + 1 + HOP, HOP + 2 + HOP, HOP + 3 + HOP))
    assert r.ttft_s == pytest.approx(1 + 2 * HOP)
    assert r.tpot_s == pytest.approx(1.0)
    assert r.output_tokens == 3 and r.error is None


def test_disaggregated_request_reserves_prefills_hands_off_and_decodes() -> None:
    c = cluster("pd")
    (r,) = c.run([spec(0, list(range(100, 120)), 3)])  # 20 tokens > threshold 8
    prefilled = 3 * HOP + 1  # reserve hop + reply hop + prefill hop, then one step
    adopted = prefilled + 2 * HOP  # token to the router, Generate to the decode worker
    assert r.chunk_times_s == pytest.approx((prefilled + HOP, adopted + 1 + HOP, adopted + 2 + HOP))
    p, d = c.engines["p0"], c.engines["d1"]
    assert p.stats.prompt_tokens_computed == 20 and d.stats.prompt_tokens_computed == 0
    for e in (p, d):  # every page is back (cached blocks stay, unreferenced)
        assert e.idle and e.scheduler.blocks.pool.num_free == e.config.num_blocks


def test_pool_hit_on_the_other_prefill_worker_counts_as_cached() -> None:
    # threshold 2: the second request's 3 uncached tokens still go to a prefill worker
    c = SimCluster(engines("ppd"), make_policy("round_robin", 2), Timing(HOP))
    prefix = list(range(100, 116))  # 4 full blocks
    first, second = spec(0, [*prefix, 1, 2, 3], 2), spec(1, [*prefix, 4, 5, 6], 2, at=10.0)
    a, b = c.run([first, second])
    assert a.cached_tokens == 0 and b.cached_tokens == 16
    assert c.engines["p1"].stats.pool_tokens_read == 16


def test_no_decode_pages_now_is_a_503_never_is_a_400_and_nothing_leaks() -> None:
    # threshold 0: always disaggregated (a decode worker prefilling the second prompt
    # itself, the prefill worker being busy, would queue it for pages instead)
    c = SimCluster(engines("pd", blocks=12), make_policy("round_robin", 0), Timing(HOP))
    # 40 tokens + 8 generated need 12 pages of 4: the second finds none free
    big, never = list(range(100, 140)), list(range(100, 160))
    a, b, n = c.run([spec(0, big, 8), spec(1, [t + 1 for t in big], 8), spec(2, never, 2)])
    assert a.ok and b.status_code == 503 and n.status_code == 400
    assert all(e.idle for e in c.engines.values())


def test_controller_moves_a_decode_worker_to_prefill_and_loses_nothing() -> None:
    config = RatioConfig(
        ttft_slo_s=0.001,
        tpot_slo_s=100.0,
        window_s=100.0,
        min_samples=2,
        patience=1,
        cooldown_s=1000.0,
    )
    controller = RatioController(config)
    c = SimCluster(
        engines("dd"),
        make_policy("round_robin", 8),
        Timing(HOP, controller_interval_s=2.0),
        controller,
    )
    specs = [spec(i, list(range(100 + i, 130 + i)), 4, at=0.5 * i) for i in range(20)]
    records = c.run(specs)
    assert all(r.ok for r in records)
    (event,) = c.role_events
    assert (event.change.from_role, event.change.to_role) == ("decode", "prefill")
    assert c.role_counts() == {"prefill": 1, "decode": 1, "mixed": 0}
    assert controller.history == (event.change,)
    assert event.done_s >= event.change.at_s

"""Scheduler: exact batches for small configs, preemption, finish, and stateful properties."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from kvpool.hashing import Namespace, PrefixHasher
from tests.unit.machine_settings import STATEFUL
from workers.core.scheduler import ScheduledBatch, Scheduler, SchedulerConfig
from workers.core.sequence import FinishReason, SamplingParams, SeqStatus, Sequence

HASHER = PrefixHasher(Namespace(model="sched@0", dtype="float32", block_tokens=4), b"key")
FAKE_TOKEN = 7


def make_sched(
    num_blocks: int = 16,
    block_tokens: int = 4,
    max_num_seqs: int = 64,
    max_num_batched_tokens: int = 8,
    max_model_len: int = 2048,
    prefix_caching: bool = True,
) -> Scheduler:
    config = SchedulerConfig(
        num_blocks=num_blocks,
        block_tokens=block_tokens,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        prefix_caching=prefix_caching,
    )
    return Scheduler(config, HASHER)


def make_seq(request_id: str, token_ids: list[int], max_tokens: int) -> Sequence:
    return Sequence(request_id, list(token_ids), SamplingParams(max_tokens=max_tokens))


def simulate(sched: Scheduler, batch: ScheduledBatch) -> None:
    """What the engine does after the model ran ``batch``."""
    sched.update(batch)
    for seq, _ in batch.entries:
        if seq.num_computed_tokens == seq.num_tokens:
            seq.token_ids.append(FAKE_TOKEN)
            if seq.num_output_tokens >= seq.params.max_tokens:
                sched.finish(seq, FinishReason.LENGTH)


def step(sched: Scheduler) -> ScheduledBatch:
    batch = sched.schedule()
    simulate(sched, batch)
    return batch


def ids(batch: ScheduledBatch) -> list[tuple[str, int]]:
    return [(seq.request_id, n) for seq, n in batch.entries]


def run_steps(sched: Scheduler, k: int) -> list[list[tuple[str, int]]]:
    return [ids(step(sched)) for _ in range(k)]


# -- configuration and admission control -------------------------------------------------------


@pytest.mark.parametrize(
    "field", ["num_blocks", "block_tokens", "max_num_seqs", "max_num_batched_tokens"]
)
def test_config_rejects_non_positive(field: str) -> None:
    kwargs: dict[str, int] = {"num_blocks": 4, "block_tokens": 4, "max_model_len": 64, field: 0}
    with pytest.raises(ValueError, match=field):
        SchedulerConfig(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("config", "fits", "too_big", "message"),
    [
        ({"max_model_len": 16}, 4, 5, "exceeds the model length"),
        # The last sampled token never needs KV: 10 + 7 tokens fit 4 pages of 4, 10 + 8 not.
        ({"num_blocks": 4, "block_tokens": 4}, 7, 8, "needs 5 KV pages but the cache has 4"),
    ],
)
def test_check_fits(config: dict[str, int], fits: int, too_big: int, message: str) -> None:
    sched = make_sched(**config)  # type: ignore[arg-type]
    prompt = list(range(12 if "max_model_len" in config else 10))
    sched.check_fits(make_seq("ok", prompt, max_tokens=fits))
    bad = make_seq("bad", prompt, max_tokens=too_big)
    with pytest.raises(ValueError, match=message):
        sched.check_fits(bad)
    with pytest.raises(ValueError):
        sched.add(bad)
    assert not sched.waiting
    assert not sched.has_work


def test_check_fits_ignores_current_load() -> None:
    sched = make_sched(num_blocks=4, block_tokens=4, max_num_batched_tokens=16)
    sched.add(make_seq("a", list(range(12)), max_tokens=4))
    step(sched)
    assert sched.blocks.pool.num_free == 1
    sched.add(make_seq("b", list(range(12)), max_tokens=4))  # could never run *now*, but fits
    assert len(sched.waiting) == 1


def test_add_queues_and_empty_schedule() -> None:
    sched = make_sched()
    assert not sched.has_work
    batch = sched.schedule()
    assert not batch
    assert batch.entries == []
    assert batch.preempted == []
    assert batch.num_tokens == 0
    s = make_seq("a", [1, 2], max_tokens=1)
    sched.add(s)
    assert s.status is SeqStatus.WAITING
    assert list(sched.waiting) == [s]
    assert sched.has_work


# -- exact batches -----------------------------------------------------------------------------


def test_long_prompt_is_chunked_across_steps() -> None:
    sched = make_sched(num_blocks=16, block_tokens=4, max_num_batched_tokens=8)
    a = make_seq("a", list(range(100, 120)), max_tokens=2)
    sched.add(a)

    b1 = step(sched)
    assert ids(b1) == [("a", 8)]
    assert a.status is SeqStatus.RUNNING
    assert a.block_table == [0, 1]
    assert a.num_computed_tokens == 8
    assert a.num_output_tokens == 0

    assert ids(step(sched)) == [("a", 8)]
    assert a.block_table == [0, 1, 2, 3]
    assert a.num_computed_tokens == 16

    assert ids(step(sched)) == [("a", 4)]
    assert a.block_table == [0, 1, 2, 3, 4]
    assert a.num_computed_tokens == 20
    assert a.output_token_ids == [FAKE_TOKEN]
    assert a.block_hashes == HASHER.chain(a.token_ids[:20], 4)

    assert ids(step(sched)) == [("a", 1)]
    assert a.output_token_ids == [FAKE_TOKEN, FAKE_TOKEN]
    assert a.is_finished
    assert a.finish_reason is FinishReason.LENGTH
    assert a.block_table == []
    assert not sched.has_work
    pool = sched.blocks.pool
    assert pool.free_order() == [*range(6, 16), 5, 4, 3, 2, 1, 0]
    assert pool.ref_counts == [0] * 16


def test_decodes_take_the_budget_before_prefills() -> None:
    sched = make_sched(num_blocks=16, block_tokens=4, max_num_batched_tokens=2)
    sched.add(make_seq("a", [1, 2], max_tokens=3))
    sched.add(make_seq("b", [3, 4], max_tokens=3))
    sched.add(make_seq("c", list(range(10, 20)), max_tokens=1))
    assert run_steps(sched, 9) == [
        [("a", 2)],
        [("a", 1), ("b", 1)],  # b's first chunk of 1 (of 2)
        [("a", 1), ("b", 1)],  # b's last prompt token counts as a decode
        [("b", 1), ("c", 1)],  # a finished; c gets what b leaves
        [("b", 1), ("c", 1)],
        [("c", 2)],
        [("c", 2)],
        [("c", 2)],
        [("c", 2)],
    ]
    assert not sched.has_work


def test_decode_and_prefill_share_the_budget() -> None:
    sched = make_sched(num_blocks=16, block_tokens=4, max_num_batched_tokens=8)
    a = make_seq("a", [1, 2, 3], max_tokens=5)
    b = make_seq("b", list(range(100, 120)), max_tokens=2)
    sched.add(a)
    sched.add(b)
    assert run_steps(sched, 6) == [
        [("a", 3), ("b", 5)],
        [("a", 1), ("b", 7)],
        [("a", 1), ("b", 7)],
        [("a", 1), ("b", 1)],
        [("a", 1), ("b", 1)],
        [],
    ]
    assert a.finish_reason is FinishReason.LENGTH
    assert b.finish_reason is FinishReason.LENGTH
    assert a.num_output_tokens == 5
    assert b.num_output_tokens == 2


def test_decodes_lead_whatever_the_running_order() -> None:
    # White box: put a request in prefill ahead of a decoding one in ``running``. Through
    # the public calls ``running`` stays in admission order and a request is only admitted
    # once the older ones finished their prompts, so this order never arises on its own.
    sched = make_sched(num_blocks=16, block_tokens=4, max_num_batched_tokens=8)
    p = make_seq("p", list(range(100, 120)), max_tokens=1)
    d = make_seq("d", [1, 2], max_tokens=4)
    sched.add(d)
    sched.add(p)
    assert ids(step(sched)) == [("d", 2), ("p", 6)]
    sched.running.reverse()
    assert sched.running == [p, d]
    batch = step(sched)
    assert ids(batch) == [("d", 1), ("p", 7)]


def test_single_token_admissions_are_sorted_before_prefill_chunks() -> None:
    sched = make_sched(num_blocks=16, block_tokens=4, max_num_batched_tokens=8)
    sched.add(make_seq("p", list(range(100, 112)), max_tokens=1))
    assert ids(step(sched)) == [("p", 8)]
    sched.add(make_seq("one", [5], max_tokens=1))
    assert ids(step(sched)) == [("one", 1), ("p", 4)]
    assert not sched.has_work


def test_max_num_seqs_caps_running() -> None:
    sched = make_sched(num_blocks=16, block_tokens=4, max_num_seqs=2, max_num_batched_tokens=8)
    for rid in "abc":
        sched.add(make_seq(rid, [1, 2], max_tokens=2))
    b1 = step(sched)
    assert ids(b1) == [("a", 2), ("b", 2)]
    assert [s.request_id for s in sched.waiting] == ["c"]
    assert run_steps(sched, 3) == [[("a", 1), ("b", 1)], [("c", 2)], [("c", 1)]]
    assert not sched.has_work


def test_admission_in_arrival_order_blocks_behind_the_head() -> None:
    sched = make_sched(num_blocks=4, block_tokens=4, max_num_batched_tokens=24)
    a = make_seq("a", list(range(100, 108)), max_tokens=4)
    b = make_seq("b", list(range(200, 212)), max_tokens=1)
    c = make_seq("c", [1, 2], max_tokens=1)
    for s in (a, b, c):
        sched.add(s)
    # b needs 3 pages with 2 free; c would fit but must not overtake b
    assert ids(step(sched)) == [("a", 8)]
    assert a.block_table == [0, 1]
    assert list(sched.waiting) == [b, c]
    assert run_steps(sched, 3) == [[("a", 1)], [("a", 1)], [("a", 1)]]
    assert a.is_finished
    assert sched.blocks.pool.free_order() == [3, 2, 1, 0]
    assert ids(step(sched)) == [("b", 12), ("c", 2)]
    assert b.is_finished
    assert c.is_finished
    # b held [3, 2, 1] and c [0]; each gave its pages back last block first
    assert sched.blocks.pool.free_order() == [1, 2, 3, 0]


def test_prefix_hits_at_admission() -> None:
    sched = make_sched(num_blocks=16, block_tokens=4, max_num_batched_tokens=16)
    prompt = list(range(50, 59))  # 9 tokens: 2 full blocks
    a = make_seq("a", prompt, max_tokens=1)
    sched.add(a)
    assert ids(step(sched)) == [("a", 9)]
    assert a.is_finished
    free = sched.blocks.pool.free_order()
    assert free[-3:] == [2, 1, 0]

    b = make_seq("b", prompt, max_tokens=2)
    sched.add(b)
    assert ids(step(sched)) == [("b", 1)]  # the last token is always computed
    assert b.num_cached_tokens == 8
    assert b.num_computed_tokens == 9
    assert b.block_table[:2] == [0, 1]

    c = make_seq("c", prompt[:8], max_tokens=1)  # exactly two blocks: only one can hit
    sched.add(c)
    batch = step(sched)
    assert ids(batch) == [("b", 1), ("c", 4)]
    assert c.num_cached_tokens == 4
    assert c.is_finished
    assert b.is_finished
    assert sched.blocks.pool.ref_counts == [0] * 16


def test_prefix_hits_share_pages_with_running_requests() -> None:
    sched = make_sched(num_blocks=16, block_tokens=4, max_num_batched_tokens=16)
    a = make_seq("a", list(range(50, 59)), max_tokens=4)
    sched.add(a)
    step(sched)
    b = make_seq("b", [*range(50, 58), 1, 2], max_tokens=4)
    sched.add(b)
    assert ids(step(sched)) == [("a", 1), ("b", 2)]
    assert b.block_table[:2] == a.block_table[:2] == [0, 1]
    assert sched.blocks.pool.ref_counts[:2] == [2, 2]
    sched.finish(a, FinishReason.ABORT)
    assert sched.blocks.pool.ref_counts[:2] == [1, 1]


def test_prefix_caching_off_never_hits() -> None:
    sched = make_sched(num_blocks=16, block_tokens=4, prefix_caching=False)
    prompt = list(range(50, 59))
    sched.add(make_seq("a", prompt, max_tokens=1))
    assert run_steps(sched, 2) == [[("a", 8)], [("a", 1)]]
    b = make_seq("b", prompt, max_tokens=1)
    sched.add(b)
    assert run_steps(sched, 2) == [[("b", 8)], [("b", 1)]]
    assert b.num_cached_tokens == 0


def test_admission_with_prefix_hits_counts_pages_for_the_rest() -> None:
    """Regression: with prefix hits held by a running request, admission once under-counted
    the fresh pages it needed and schedule() crashed with RuntimeError in allocate()."""
    sched = make_sched(num_blocks=6, block_tokens=4, max_num_batched_tokens=8)
    a = make_seq("a", list(range(50, 59)), max_tokens=3)
    c = make_seq("c", list(range(80, 88)), max_tokens=4)
    sched.add(a)
    sched.add(c)
    assert run_steps(sched, 3) == [[("a", 8)], [("a", 1), ("c", 7)], [("a", 1), ("c", 1)]]
    assert sched.blocks.pool.num_free == 1
    # b hits a's two named blocks (held by a) and needs 2 fresh pages for its other 8 tokens
    b = make_seq("b", [*range(50, 58), *range(60, 68)], max_tokens=1)
    sched.add(b)
    assert run_steps(sched, 3) == [[("a", 1), ("c", 1)], [("c", 1)], [("c", 1)]]
    assert list(sched.waiting) == [b]
    assert ids(step(sched)) == [("b", 8)]
    assert b.num_cached_tokens == 8
    assert b.is_finished
    assert sched.blocks.pool.num_free == 6


def test_no_zero_token_entries_when_decodes_outnumber_the_budget() -> None:
    # White box: shrink the budget under three decoding requests (with a fixed budget every
    # running request got at least one token when admitted, so they never outnumber it).
    sched = make_sched(num_blocks=16, block_tokens=4, max_num_batched_tokens=8)
    for rid in "abc":
        sched.add(make_seq(rid, [1, 2], max_tokens=4))
    assert ids(step(sched)) == [("a", 2), ("b", 2), ("c", 2)]
    sched.config = SchedulerConfig(
        num_blocks=16, block_tokens=4, max_model_len=2048, max_num_batched_tokens=2
    )
    assert ids(step(sched)) == [("a", 1), ("b", 1)]
    assert ids(step(sched)) == [("a", 1), ("b", 1)]


# -- preemption --------------------------------------------------------------------------------


def test_preemption_evicts_newest_and_recomputes_from_prefix_hits() -> None:
    sched = make_sched(num_blocks=4, block_tokens=4, max_num_seqs=2, max_num_batched_tokens=8)
    pool = sched.blocks.pool
    a = make_seq("a", [10, 11, 12, 13], max_tokens=8)
    b = make_seq("b", [20, 21, 22, 23], max_tokens=8)
    c = make_seq("c", [30, 31, 32, 33], max_tokens=1)
    for s in (a, b, c):
        sched.add(s)
    assert run_steps(sched, 5) == [[("a", 4), ("b", 4)]] + [[("a", 1), ("b", 1)]] * 4
    assert a.block_table == [0, 2]
    assert b.block_table == [1, 3]
    assert a.num_computed_tokens == b.num_computed_tokens == 8
    assert pool.num_free == 0
    assert list(sched.waiting) == [c]

    # a needs a third page: b (admitted last) is preempted and goes in front of c
    batch = step(sched)
    assert ids(batch) == [("a", 1)]
    assert batch.preempted == [b]
    assert sched.num_preemptions == 1
    assert b.status is SeqStatus.WAITING
    assert b.block_table == []
    assert b.block_hashes == []
    assert b.num_computed_tokens == 0
    assert b.num_cached_tokens == 0
    assert b.num_tokens == 9  # prompt and the 5 tokens produced so far are kept
    assert list(sched.waiting) == [b, c]
    assert sched.running == [a]
    assert a.block_table == [0, 2, 3]  # page 3 (b's second block) was evicted
    assert pool.free_order() == [1]  # b's first block, still named

    # b's head cannot be readmitted yet (3 pages needed, 1 free) and c must wait behind it
    assert ids(step(sched)) == [("a", 1)]
    assert list(sched.waiting) == [b, c]
    assert ids(step(sched)) == [("a", 1)]
    assert a.is_finished
    assert pool.free_order() == [1, 3, 2, 0]

    # b restarts at its prefix-cache hit (its first block, page 1), then c follows
    batch = step(sched)
    assert ids(batch) == [("b", 5), ("c", 3)]
    assert b.num_cached_tokens == 4
    assert b.num_computed_tokens == 9
    assert b.block_table == [1, 3, 2]
    assert c.block_table == [0]
    assert run_steps(sched, 3) == [[("b", 1), ("c", 1)], [("b", 1)], []]
    assert b.is_finished
    assert c.is_finished
    assert b.num_output_tokens == 8
    assert pool.num_free == 4
    assert pool.ref_counts == [0] * 4


def test_preemption_without_prefix_cache_restarts_at_zero() -> None:
    sched = make_sched(num_blocks=4, block_tokens=4, max_num_batched_tokens=8, prefix_caching=False)
    a = make_seq("a", [10, 11, 12, 13], max_tokens=8)
    b = make_seq("b", [20, 21, 22, 23], max_tokens=8)
    sched.add(a)
    sched.add(b)
    run_steps(sched, 5)
    batch = step(sched)
    assert ids(batch) == [("a", 1)]
    assert batch.preempted == [b]
    assert run_steps(sched, 2) == [[("a", 1)], [("a", 1)]]
    assert a.is_finished
    assert ids(step(sched)) == [("b", 8)]  # recomputed from scratch, in chunks
    assert b.num_cached_tokens == 0
    assert run_steps(sched, 4) == [[("b", 1)], [("b", 1)], [("b", 1)], []]
    assert b.num_output_tokens == 8
    assert b.is_finished
    assert sched.num_preemptions == 1


def test_newest_request_preempts_itself() -> None:
    sched = make_sched(num_blocks=3, block_tokens=4, max_num_batched_tokens=8)
    a = make_seq("a", [10, 11, 12, 13], max_tokens=5)
    b = make_seq("b", [20, 21], max_tokens=5)
    sched.add(a)
    sched.add(b)
    assert run_steps(sched, 3) == [[("a", 4), ("b", 2)]] + [[("a", 1), ("b", 1)]] * 2
    assert sched.blocks.pool.num_free == 0
    # b needs a second page and is itself the newest: it goes
    batch = step(sched)
    assert ids(batch) == [("a", 1)]
    assert batch.preempted == [b]
    assert list(sched.waiting) == [b]
    assert ids(step(sched)) == [("a", 1)]
    assert a.is_finished
    batch = step(sched)
    assert ids(batch) == [("b", 1)]  # 4 of its 5 tokens hit the cache
    assert b.num_cached_tokens == 4
    assert b.block_table == [1, 2]
    assert run_steps(sched, 2) == [[("b", 1)], []]
    assert b.num_output_tokens == 5


def test_preempting_an_already_scheduled_request_drops_its_entry() -> None:
    # White box (see test_decodes_lead_whatever_the_running_order): the decoding request is
    # scheduled first but is the newest, so the prefill that runs out of pages preempts it.
    sched = make_sched(num_blocks=4, block_tokens=4, max_num_batched_tokens=8)
    d = make_seq("d", [1, 2, 3, 4], max_tokens=4)
    p = make_seq("p", list(range(100, 111)), max_tokens=1)
    sched.add(d)
    sched.add(p)
    assert ids(step(sched)) == [("d", 4), ("p", 4)]
    sched.running.reverse()
    batch = step(sched)
    assert ids(batch) == [("p", 7)]
    assert batch.preempted == [d]
    assert batch.num_tokens == 7
    assert p.is_finished
    assert d.status is SeqStatus.WAITING
    assert d.num_tokens == 5
    assert ids(step(sched)) == [("d", 1)]
    assert d.num_cached_tokens == 4


# -- finish ------------------------------------------------------------------------------------


def test_finish_from_waiting_is_idempotent() -> None:
    sched = make_sched()
    a = make_seq("a", [1, 2, 3], max_tokens=2)
    b = make_seq("b", [4, 5, 6], max_tokens=2)
    sched.add(a)
    sched.add(b)
    sched.finish(a, FinishReason.ABORT)
    assert a.status is SeqStatus.FINISHED
    assert a.finish_reason is FinishReason.ABORT
    assert list(sched.waiting) == [b]
    sched.finish(a, FinishReason.STOP)
    assert a.finish_reason is FinishReason.ABORT
    assert list(sched.waiting) == [b]
    assert sched.blocks.pool.free_order() == list(range(16))
    assert ids(step(sched)) == [("b", 3)]


def test_finish_from_running_frees_pages_and_is_idempotent() -> None:
    sched = make_sched(num_blocks=8, block_tokens=4, max_num_batched_tokens=8)
    a = make_seq("a", list(range(100, 106)), max_tokens=4)
    b = make_seq("b", [1], max_tokens=4)
    sched.add(a)
    sched.add(b)
    step(sched)
    assert a.block_table == [0, 1]
    assert b.block_table == [2]
    sched.finish(a, FinishReason.ABORT)
    assert a.is_finished
    assert a.block_table == []
    assert sched.running == [b]
    assert sched.blocks.pool.free_order() == [3, 4, 5, 6, 7, 1, 0]
    sched.finish(a, FinishReason.ABORT)  # no double free
    assert sched.blocks.pool.free_order() == [3, 4, 5, 6, 7, 1, 0]
    assert ids(step(sched)) == [("b", 1)]
    sched.finish(b, FinishReason.STOP)
    assert b.finish_reason is FinishReason.STOP
    assert not sched.has_work
    assert sched.blocks.pool.ref_counts == [0] * 8


def test_finish_of_a_preempted_request() -> None:
    sched = make_sched(num_blocks=3, block_tokens=4, max_num_batched_tokens=8)
    a = make_seq("a", [10, 11, 12, 13], max_tokens=5)
    b = make_seq("b", [20, 21], max_tokens=5)
    sched.add(a)
    sched.add(b)
    run_steps(sched, 3)
    assert step(sched).preempted == [b]
    sched.finish(b, FinishReason.ABORT)
    assert not sched.waiting
    assert b.is_finished
    run_steps(sched, 1)
    assert not sched.has_work
    assert sched.blocks.pool.num_free == 3


# -- stateful properties -----------------------------------------------------------------------

PREFIXES = (
    [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12],
    [1, 2, 3, 4, 5, 6, 20, 21, 22, 23, 24, 25],
    [30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41],
)
MAX_DRAIN_STEPS = 2000


class SchedulerMachine(RuleBasedStateMachine):
    """Random adds, steps and aborts; every bookkeeping invariant after each operation."""

    def __init__(self) -> None:
        super().__init__()
        self.sched = make_sched()
        self.live: list[Sequence] = []
        self.done: list[Sequence] = []
        self.next_id = 0

    @initialize(
        block_tokens=st.sampled_from([1, 2, 4]),
        num_blocks=st.integers(min_value=3, max_value=16),
        budget=st.integers(min_value=1, max_value=12),
        max_num_seqs=st.integers(min_value=1, max_value=4),
        max_model_len=st.integers(min_value=8, max_value=24),
        prefix_caching=st.booleans(),
    )
    def setup(
        self,
        block_tokens: int,
        num_blocks: int,
        budget: int,
        max_num_seqs: int,
        max_model_len: int,
        prefix_caching: bool,
    ) -> None:
        self.sched = make_sched(
            num_blocks=num_blocks,
            block_tokens=block_tokens,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=budget,
            max_model_len=max_model_len,
            prefix_caching=prefix_caching,
        )

    # -- rules ---------------------------------------------------------------------------
    @rule(
        prefix=st.integers(min_value=0, max_value=len(PREFIXES) - 1),
        prefix_len=st.integers(min_value=0, max_value=12),
        suffix=st.lists(st.integers(min_value=0, max_value=2), max_size=5),
        max_tokens=st.integers(min_value=1, max_value=5),
    )
    def add(self, prefix: int, prefix_len: int, suffix: list[int], max_tokens: int) -> None:
        tokens = PREFIXES[prefix][:prefix_len] + suffix or [0]
        seq = make_seq(f"r{self.next_id}", tokens, max_tokens)
        self.next_id += 1
        config = self.sched.config
        total = len(tokens) + max_tokens
        # KV is needed for every token but the last sampled one.
        fits = total <= config.max_model_len and -(-(total - 1) // config.block_tokens) <= (
            config.num_blocks
        )
        if not fits:
            with pytest.raises(ValueError):
                self.sched.add(seq)
            assert all(s is not seq for s in self.sched.waiting)
            return
        self.sched.add(seq)
        assert self.sched.waiting[-1] is seq
        self.live.append(seq)

    @rule()
    def step(self) -> None:
        self._step()

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(self.live))
        self.sched.finish(seq, FinishReason.ABORT)
        assert seq.status is SeqStatus.FINISHED
        assert seq.finish_reason is FinishReason.ABORT
        self.sched.finish(seq, FinishReason.LENGTH)  # idempotent
        assert seq.finish_reason is FinishReason.ABORT
        self._settle()

    # -- helpers -------------------------------------------------------------------------
    def _settle(self) -> None:
        self.done += [s for s in self.live if s.is_finished]
        self.live = [s for s in self.live if not s.is_finished]

    def _step(self) -> None:
        sched = self.sched
        config = sched.config
        had_work = sched.has_work
        running_before = list(sched.running)
        waiting_before = list(sched.waiting)
        uncomputed_before = {s.request_id: s.num_uncomputed for s in running_before}
        decodes_before = [s for s in running_before if s.num_uncomputed == 1]

        batch = sched.schedule()

        # progress: with work to do, something always runs
        assert bool(batch) == had_work
        # budgets
        assert batch.num_tokens <= config.max_num_batched_tokens
        assert len(sched.running) <= config.max_num_seqs
        seqs = [s for s, _ in batch.entries]
        assert len({id(s) for s in seqs}) == len(seqs)
        for seq, n in batch.entries:
            assert seq.status is SeqStatus.RUNNING
            assert 1 <= n <= seq.num_uncomputed
            assert len(seq.block_table) >= sched.blocks.blocks_for(seq.num_computed_tokens + n)
        # single-token completions (decodes) lead the batch
        keys = [not (n == 1 and s.num_uncomputed == 1) for s, n in batch.entries]
        assert keys == sorted(keys)
        # preemption: newest running requests first, to the front of waiting, no admission
        k = len(batch.preempted)
        if k:
            assert batch.preempted == running_before[::-1][:k]
            assert sched.running == running_before[:-k]
            assert list(sched.waiting)[:k] == batch.preempted[::-1]
            for seq in batch.preempted:
                assert seq.status is SeqStatus.WAITING
                assert seq.block_table == []
                assert seq.num_computed_tokens == 0
                assert seq.num_cached_tokens == 0
                assert all(seq is not s for s in seqs)
        # admission: a prefix of the waiting queue, in arrival order
        # (the batch itself may list them in another order: single tokens are sorted first)
        admitted = {id(s) for s in seqs} & {id(w) for w in waiting_before}
        in_order = waiting_before[: len(admitted)]
        assert admitted == {id(s) for s in in_order}
        if k:
            assert not admitted
        kept = [s for s in running_before if s.status is SeqStatus.RUNNING]
        assert [id(s) for s in sched.running] == [id(s) for s in [*kept, *in_order]]
        # decode first: if any request still in prefill got tokens, every decode did too
        if any(uncomputed_before.get(s.request_id, 1) > 1 for s in seqs):
            for d in decodes_before:
                if d.status is SeqStatus.RUNNING:
                    assert any(d is s for s in seqs)

        simulate(sched, batch)
        self._settle()

    # -- invariants ----------------------------------------------------------------------
    @invariant()
    def bookkeeping(self) -> None:
        sched = self.sched
        pool = sched.blocks.pool
        bt = sched.config.block_tokens
        assert pool.num_free + pool.num_used == pool.num_blocks
        held: Counter[int] = Counter()
        for seq in sched.running:
            held.update(seq.block_table)
        assert sum(pool.ref_counts) == sum(held.values())
        assert [pool.ref_counts[p] for p in range(pool.num_blocks)] == [
            held[p] for p in range(pool.num_blocks)
        ]
        assert sorted(pool.free_order()) == [p for p in range(pool.num_blocks) if not held[p]]
        assert len(sched.running) <= sched.config.max_num_seqs
        for seq in sched.running:
            assert seq.status is SeqStatus.RUNNING
            assert len(set(seq.block_table)) == len(seq.block_table)
            assert len(seq.block_table) >= -(-seq.num_computed_tokens // bt)
            assert 0 < seq.num_computed_tokens <= seq.num_tokens
            assert seq.num_uncomputed >= 1  # the engine appended a token after each full run
            assert seq.num_cached_tokens % bt == 0
            assert seq.num_cached_tokens < seq.num_tokens
            if sched.config.prefix_caching:
                k = len(seq.block_hashes)
                assert k <= seq.num_computed_tokens // bt
                assert seq.block_hashes == HASHER.chain(seq.token_ids[: k * bt], bt)
                for page, h in zip(seq.block_table, seq.block_hashes, strict=False):
                    assert pool.block_hash[page] in (h, None)
            else:
                assert seq.block_hashes == []
        for seq in sched.waiting:
            assert seq.status is SeqStatus.WAITING
            assert seq.block_table == []
            assert seq.block_hashes == []
            assert seq.num_computed_tokens == 0
        for page, name in enumerate(pool.block_hash):
            if name is not None:
                assert pool.lookup(name) == page
        queued = [*sched.running, *sched.waiting]
        assert len({id(s) for s in queued}) == len(queued)
        assert {id(s) for s in queued} == {id(s) for s in self.live}
        for seq in self.done:
            assert seq.is_finished
            assert seq.block_table == []
            assert seq.num_output_tokens <= seq.params.max_tokens
        if not sched.has_work:
            assert pool.num_free == pool.num_blocks
            assert pool.ref_counts == [0] * pool.num_blocks

    def teardown(self) -> None:
        # every request finishes if steps keep being taken
        for _ in range(MAX_DRAIN_STEPS):
            if not self.sched.has_work:
                break
            self._step()
            self.bookkeeping()
        assert not self.sched.has_work, f"requests still pending: {self.live}"
        assert self.live == []
        for seq in self.done:
            assert seq.finish_reason in (FinishReason.LENGTH, FinishReason.ABORT)
            if seq.finish_reason is FinishReason.LENGTH:
                assert seq.num_output_tokens == seq.params.max_tokens
        pool = self.sched.blocks.pool
        assert pool.num_free == pool.num_blocks
        assert pool.ref_counts == [0] * pool.num_blocks


SchedulerMachine.TestCase.settings = STATEFUL
TestSchedulerMachine = SchedulerMachine.TestCase

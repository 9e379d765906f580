"""Workloads: determinism, lengths, shared prefixes and the Mooncake trace's block mapping."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvserve.loadgen.mooncake_trace import TraceEntry, parse_trace
from kvserve.loadgen.workloads import (
    MIN_TOKEN,
    Lengths,
    TraceOptions,
    block_tokens,
    salted,
    shared_prefix_requests,
    synthetic_requests,
    trace_requests,
    with_arrivals,
)

VOCAB = 1000


def test_synthetic_is_deterministic_and_within_lengths() -> None:
    a = synthetic_requests("prefill-heavy", 50, seed=3, vocab=VOCAB)
    assert a == synthetic_requests("prefill-heavy", 50, seed=3, vocab=VOCAB)
    assert a != synthetic_requests("prefill-heavy", 50, seed=4, vocab=VOCAB)
    assert all(384 <= s.prompt_len <= 640 and 12 <= s.max_tokens <= 20 for s in a)
    assert all(MIN_TOKEN <= t < VOCAB for s in a for t in s.prompt_token_ids)
    assert [s.index for s in a] == list(range(50))


def test_mixed_alternates_prefill_and_decode_heavy() -> None:
    specs = synthetic_requests("mixed", 6, seed=0)
    assert [s.prompt_len > 200 for s in specs] == [True, False] * 3
    assert [s.max_tokens > 64 for s in specs] == [False, True] * 3


def test_lengths_without_spread_are_exact() -> None:
    specs = synthetic_requests("decode-heavy", 5, seed=0, shapes=None)
    assert len(specs) == 5
    import random

    assert {Lengths(7).sample(random.Random(i)) for i in range(20)} == {7}
    with pytest.raises(ValueError, match="spread"):
        Lengths(10, 1.5)


def test_shared_prefix_groups_share_exactly_the_prefix() -> None:
    specs = shared_prefix_requests(
        9, 1, groups=3, prefix_len=40, suffix=Lengths(8), output=Lengths(4)
    )
    assert [s.group for s in specs] == [0, 1, 2] * 3
    assert all(s.prompt_len == 48 and s.max_tokens == 4 for s in specs)
    prefixes = [s.prompt_token_ids[:40] for s in specs]
    assert prefixes[0] == prefixes[3] == prefixes[6] != prefixes[1]
    assert len({s.prompt_token_ids[40:] for s in specs}) == 9


def test_block_tokens_depend_only_on_seed_and_id() -> None:
    assert block_tokens(0, 5, 64) == block_tokens(0, 5, 64)
    assert block_tokens(0, 5, 64) != block_tokens(1, 5, 64)
    assert len({block_tokens(0, i, 2, VOCAB) for i in range(800)}) == 800
    assert len({block_tokens(0, i, 1, VOCAB) for i in range(VOCAB - MIN_TOKEN)}) == 900
    assert all(MIN_TOKEN <= t < VOCAB for t in block_tokens(0, 10**6, 300, VOCAB))
    assert block_tokens(0, 7, 10) == block_tokens(0, 7, 64)[:10]


def entry(ts: float, n: int, out: int, ids: list[int]) -> TraceEntry:
    return TraceEntry(ts, n, out, tuple(ids))


def test_trace_equal_ids_give_equal_blocks_and_others_differ() -> None:
    entries = [
        entry(0, 1100, 6, [0, 1, 2]),
        entry(40, 1300, 5, [0, 1, 3]),
        entry(90, 600, 3, [4, 5]),
    ]
    specs = trace_requests(entries, seed=0, opts=TraceOptions(block_size=512))
    a, b, c = (s.prompt_token_ids for s in specs)
    assert [s.prompt_len for s in specs] == [1100, 1300, 600]
    assert a[:1024] == b[:1024]
    assert a[1024:1100] != b[1024:1100]
    assert a[:512] != c[:512]
    assert [s.arrival_s for s in specs] == [0.0, 0.04, 0.09]
    assert [s.max_tokens for s in specs] == [6, 5, 3]


def test_trace_scaling_of_lengths_outputs_and_count() -> None:
    entries = [entry(0, 1100, 100, [0, 1, 2]), entry(5, 1300, 7, [0, 1, 3])]
    opts = TraceOptions(512, length_scale=1 / 8, output_scale=0.5, output_cap=20, max_requests=1)
    (spec,) = trace_requests(entries, seed=0, opts=opts)
    # two full blocks of 64 tokens + the 76-token last block scaled to round(9.5) = 10
    assert spec.prompt_len == 64 + 64 + 10
    assert spec.prompt_token_ids[:64] == block_tokens(0, 0, 64)
    assert spec.max_tokens == 20
    assert trace_requests(entries, 0, opts) == trace_requests(entries, 0, opts)


def test_parse_trace_reads_the_shared_file_format(tmp_path: Path) -> None:
    lines = [
        '{"timestamp": 0, "input_length": 40, "output_length": 6, "hash_ids": [0]}',
        "",
        '{"timestamp": 27, "input_length": 600, "output_length": 2, "hash_ids": [0, 1]}',
    ]
    assert parse_trace(lines) == [entry(0, 40, 6, [0]), entry(27, 600, 2, [0, 1])]


def test_salted_keeps_lengths_and_sharing_but_changes_tokens() -> None:
    specs = shared_prefix_requests(4, 0, 2, 16, Lengths(4), Lengths(2), vocab=VOCAB)
    other = salted(specs, 3, VOCAB)
    assert [s.prompt_len for s in other] == [s.prompt_len for s in specs]
    assert other[0].prompt_token_ids[:16] == other[2].prompt_token_ids[:16]
    assert all(
        x != y for x, y in zip(specs[0].prompt_token_ids, other[0].prompt_token_ids, strict=True)
    )
    assert all(MIN_TOKEN <= t < VOCAB for s in other for t in s.prompt_token_ids)
    assert salted(specs, 0, VOCAB) == specs


def test_with_arrivals_needs_one_time_per_request() -> None:
    specs = synthetic_requests("mixed", 2, seed=0)
    assert [s.arrival_s for s in with_arrivals(specs, [0.5, 1.5])] == [0.5, 1.5]
    with pytest.raises(ValueError, match="arrival"):
        with_arrivals(specs, [0.0])

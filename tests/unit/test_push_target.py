"""The checks a pushing worker makes of a push target before it writes anything
(:mod:`kvpool.push`): its MAC, and every field against its own layout and the prompt."""

from __future__ import annotations

import dataclasses

import pytest

from kvpool.layout import KVLayout
from kvpool.push import (
    MAX_CLOCK_SKEW_MS,
    PushTarget,
    coalesce,
    lease_left_s,
    target_error,
    target_mac,
)

LAYOUT = KVLayout(
    num_layers=2, num_blocks=8, block_tokens=4, kv_heads=1, head_dim=2, dtype="float32"
)
KEY = b"k" * 32
RID = "r1"
PROMPT = 10  # 3 blocks: 2 full and a partial one
ISSUED = 1_800_000_000_000  # Unix ms


def target(**fields: object) -> PushTarget:
    """A valid target for ``RID``'s blocks 1 and 2 on a 32-page slab, changed by
    ``fields`` and MAC'd anew (so only the field under test is wrong)."""
    base = PushTarget("127.0.0.1:9", LAYOUT.wire, 1 << 20, 32, 1, (30, 5), 30.0, ISSUED)
    changed = dataclasses.replace(base, **fields)  # type: ignore[arg-type]
    return dataclasses.replace(changed, mac=target_mac(KEY, RID, changed))


def check(t: PushTarget, rid: str = RID, key: bytes = KEY, now_ms: int = ISSUED + 1) -> str | None:
    return target_error(t, LAYOUT, PROMPT, rid, key, now_ms)


def test_a_target_made_for_the_request_passes() -> None:
    assert check(target()) is None


def test_its_lease_counts_from_its_issue_not_its_arrival() -> None:
    """A target replayed later than its lease (30 s) after it was made is refused, however
    fresh its arrival; one dated ahead of this clock by more than the skew too."""
    assert lease_left_s(target(), ISSUED + 10_000) == 20.0
    assert check(target(), now_ms=ISSUED + 29_999) is None
    for now in (ISSUED + 30_000, ISSUED + 3_600_000):
        error = check(target(), now_ms=now)
        assert error is not None and "lease is over" in error
    assert check(target(), now_ms=ISSUED - MAX_CLOCK_SKEW_MS) is None
    error = check(target(), now_ms=ISSUED - MAX_CLOCK_SKEW_MS - 1)
    assert error is not None and "future" in error
    younger = dataclasses.replace(target(), issued_ms=ISSUED + 3_600_000)  # MAC of the old one
    error = check(younger, now_ms=ISSUED + 3_600_001)
    assert error is not None and "MAC" in error


@pytest.mark.parametrize(
    "fields",
    [
        {"segment": ""},
        {"segment": "a\nb"},
        {"wire": "L1x" + LAYOUT.wire},
        {"num_blocks": 0},
        {"slab_address": 0},
        {"slab_address": (1 << 64) - 16},
        {"first_block": 3},
        {"pages": (30,)},
        {"pages": (30, 5, 6)},
        {"pages": (32, 5)},
        {"pages": (5, 5)},
        {"lease_s": 0.0},
    ],
)
def test_a_target_that_does_not_fit_is_refused(fields: dict[str, object]) -> None:
    assert check(target(**fields)) is not None


def test_a_target_altered_or_for_another_request_fails_its_mac() -> None:
    good = target()
    moved = dataclasses.replace(good, pages=(29, 5))
    for bad, rid, key in ((moved, RID, KEY), (good, "r2", KEY), (good, RID, b"x" * 32)):
        error = check(bad, rid, key)
        assert error is not None and "MAC" in error


def test_the_targets_layout_has_its_own_page_count() -> None:
    theirs = target().layout(LAYOUT)
    assert theirs.wire == LAYOUT.wire and theirs.num_blocks == 32
    assert theirs.offset(1, 0) == 32 * LAYOUT.span_bytes


def test_contiguous_spans_on_both_sides_merge() -> None:
    srcs, dsts, lens = coalesce([0, 10, 20, 40], [100, 110, 130, 140], 10)
    assert (srcs, dsts, lens) == ([0, 20, 40], [100, 130, 140], [20, 10, 10])
    assert coalesce([], [], 10) == ([], [], [])

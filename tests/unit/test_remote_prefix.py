"""Pulling prefix blocks from a shared pool into the local cache (pure, with a fake pool)."""

from __future__ import annotations

from collections import abc

from kvpool.hashing import Namespace, PrefixHasher
from proto.kv_events import Stored
from workers.core.block_manager import BlockManager
from workers.core.scheduler import Scheduler, SchedulerConfig
from workers.core.sequence import SamplingParams, Sequence

BT = 4
HASHER = PrefixHasher(Namespace(model="rp@0", dtype="float32", block_tokens=BT), b"key")


class FakePool:
    """Holds a set of block hashes; ``load`` fails (verifies nothing) from ``bad_from`` on."""

    def __init__(self, hashes: list[int], bad_from: int | None = None) -> None:
        self.hashes = hashes
        self.bad_from = bad_from
        self.loads: list[tuple[list[int], list[int]]] = []
        self.prefixes: list[list[int]] = []

    def lookup(self, hashes: list[int]) -> int:
        n = 0
        for h in hashes:
            if h not in self.hashes:
                break
            n += 1
        return n

    def load(self, hashes: list[int], pages: list[int], prefix: abc.Sequence[int] = ()) -> int:
        self.loads.append((list(hashes), list(pages)))
        self.prefixes.append(list(prefix))
        return len(hashes) if self.bad_from is None else min(self.bad_from, len(hashes))


def seq(tokens: list[int]) -> Sequence:
    return Sequence("r", tokens, SamplingParams(max_tokens=2))


def test_pulled_blocks_become_local_hits() -> None:
    tokens = list(range(14))  # 3 full blocks; the last token is always computed
    remote = FakePool(HASHER.chain(tokens, BT))
    bm = BlockManager(8, BT, HASHER)
    s = seq(tokens)
    assert bm.pull_remote(s, remote) == 3
    assert remote.loads == [(HASHER.chain(tokens, BT), [0, 1, 2])]
    assert bm.pool.num_free == 8  # loaded pages wait in the cache, unowned
    pages, _ = bm.match_prefix(s)
    assert pages == [0, 1, 2]


def test_pull_starts_after_local_hits_and_stops_at_a_failed_block() -> None:
    tokens = list(range(17))  # 4 full blocks
    chain = HASHER.chain(tokens, BT)
    bm = BlockManager(8, BT, HASHER)
    bm.pool.log_events()
    first = seq(tokens[:5])  # computes block 0 locally
    bm.allocate(first, 5)
    first.num_computed_tokens = 5
    bm.commit(first)
    remote = FakePool(chain, bad_from=1)
    s = seq(tokens)
    assert bm.pull_remote(s, remote) == 1
    assert remote.loads[0][0] == chain[1:4]  # block 0 was a local hit: not asked for
    assert remote.prefixes == [chain[:1]]  # but named, so a hit refreshes the whole chain
    assert [len(p) for p in bm.match_prefix(s)] == [2, 2]
    # the pulled block is logged with its parent, the local hit before it
    assert bm.pool.take_events() == [
        Stored(chain[0], HASHER.unsalted_root),
        Stored(chain[1], chain[0]),
    ]


def test_pull_never_takes_more_pages_than_are_free() -> None:
    tokens = list(range(21))
    bm = BlockManager(2, BT, HASHER)
    remote = FakePool(HASHER.chain(tokens, BT))
    assert bm.pull_remote(seq(tokens), remote) == 2


def test_scheduler_admits_with_pool_hits_and_reports_new_blocks() -> None:
    tokens = list(range(10))
    remote = FakePool(HASHER.chain(tokens, BT))
    sched = Scheduler(
        SchedulerConfig(num_blocks=8, block_tokens=BT, max_model_len=2048), HASHER, remote=remote
    )
    s = seq(tokens)
    sched.add(s)
    batch = sched.schedule()
    assert batch.entries == [(s, 2)]  # 8 of 10 tokens came from the pool
    assert s.num_cached_tokens == 8 and s.num_pool_tokens == 8
    sched.update(batch)
    assert batch.committed == []  # the pulled blocks were named already; block 3 is partial
    s.token_ids.extend([100, 101])
    batch = sched.schedule()
    sched.update(batch)
    assert [p for _, p in batch.committed] == [s.block_table[2]]

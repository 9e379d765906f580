"""BlockManager: block tables, prefix matching, commit and release, exactly."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool.hashing import Namespace, PrefixHasher
from proto.kv_events import Stored
from workers.core.block_manager import BlockManager, PrefixHit
from workers.core.sequence import SamplingParams, Sequence

BT = 4
HASHER = PrefixHasher(Namespace(model="bm@0", dtype="float32", block_tokens=BT), b"key")


def make_seq(request_id: str, token_ids: list[int]) -> Sequence:
    return Sequence(request_id, list(token_ids), SamplingParams(max_tokens=4))


def run_prefill(bm: BlockManager, seq: Sequence) -> None:
    """Allocate, "compute" and commit the whole of ``seq`` in one chunk."""
    hits = bm.match_prefix(seq)
    n = seq.num_tokens - len(hits[0]) * bm.block_tokens
    bm.allocate(seq, n, hits)
    seq.num_computed_tokens += n
    bm.commit(seq)


# -- sizes and plain allocation ----------------------------------------------------------------


def test_blocks_for() -> None:
    bm = BlockManager(4, BT, HASHER)
    assert [bm.blocks_for(n) for n in (0, 1, 3, 4, 5, 8, 9)] == [0, 1, 1, 1, 2, 2, 3]


def test_allocate_covers_new_tokens_without_computing_them() -> None:
    bm = BlockManager(8, BT, HASHER)
    s = make_seq("a", list(range(10)))
    assert bm.can_allocate(s, 10)
    bm.allocate(s, 10)
    assert s.block_table == [0, 1, 2]
    assert s.num_computed_tokens == 0
    assert s.num_cached_tokens == 0
    assert s.block_hashes == []
    assert bm.pool.ref_counts[:4] == [1, 1, 1, 0]


def test_allocate_in_chunks_only_takes_missing_pages() -> None:
    bm = BlockManager(8, BT, HASHER)
    s = make_seq("a", list(range(11)))
    bm.allocate(s, 3)
    assert s.block_table == [0]
    s.num_computed_tokens = 3
    bm.allocate(s, 1)  # still inside block 0
    assert s.block_table == [0]
    s.num_computed_tokens = 4
    bm.allocate(s, 5)
    assert s.block_table == [0, 1, 2]
    s.num_computed_tokens = 9
    bm.allocate(s, 2)
    assert s.block_table == [0, 1, 2]
    assert bm.pool.free_order() == [3, 4, 5, 6, 7]


def test_can_allocate_boundary_for_a_running_sequence() -> None:
    bm = BlockManager(3, BT, HASHER)
    s = make_seq("a", list(range(12)))
    bm.allocate(s, 4)
    s.num_computed_tokens = 4
    assert bm.can_allocate(s, 8)  # two more pages, two free
    assert not bm.can_allocate(s, 9)  # three more pages
    bm.allocate(s, 8)
    assert s.block_table == [0, 1, 2]
    assert bm.can_allocate(s, 0)
    s.num_computed_tokens = 12
    assert not bm.can_allocate(s, 1)


# -- match_prefix ------------------------------------------------------------------------------


def test_match_prefix_on_empty_cache() -> None:
    bm = BlockManager(8, BT, HASHER)
    assert bm.match_prefix(make_seq("a", list(range(12)))) == ([], [])


@pytest.mark.parametrize(
    ("prompt_len", "expected_hits"),
    [(1, 0), (4, 0), (5, 1), (7, 1), (8, 1), (9, 2), (12, 2), (13, 3), (16, 3), (17, 4)],
)
def test_match_prefix_never_covers_the_last_token(prompt_len: int, expected_hits: int) -> None:
    bm = BlockManager(16, BT, HASHER)
    donor = make_seq("donor", [*range(16), 99])
    run_prefill(bm, donor)  # blocks 0..3 full, cached
    assert len(donor.block_hashes) == 4
    s = make_seq("s", list(range(prompt_len)))
    pages, hashes = bm.match_prefix(s)
    assert pages == donor.block_table[:expected_hits]
    assert hashes == HASHER.chain(list(range(16)), BT)[:expected_hits]
    assert expected_hits * BT <= prompt_len - 1
    # nothing is taken by a match
    assert s.block_table == []
    assert s.num_computed_tokens == 0


def test_match_prefix_stops_at_first_miss() -> None:
    bm = BlockManager(16, BT, HASHER)
    run_prefill(bm, make_seq("a", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]))
    # same first block, different second block, same third block: the chain stops at 1
    s = make_seq("b", [1, 2, 3, 4, 0, 6, 7, 8, 9, 10, 11, 12, 13])
    pages, hashes = bm.match_prefix(s)
    assert pages == [0]
    assert hashes == HASHER.chain([1, 2, 3, 4], BT)


def test_match_prefix_depends_on_the_key() -> None:
    bm = BlockManager(8, BT, HASHER)
    run_prefill(bm, make_seq("a", list(range(9))))
    other = BlockManager(8, BT, PrefixHasher(HASHER.namespace, b"another key"))
    other.pool = bm.pool  # same pages and names, same namespace, other cluster secret
    assert bm.match_prefix(make_seq("b", list(range(9))))[0] == [0, 1]
    assert other.match_prefix(make_seq("b", list(range(9)))) == ([], [])


def test_cache_salts_never_share_a_prefix() -> None:
    bm = BlockManager(8, BT, HASHER)
    tenant_a = make_seq("a", list(range(9)))
    tenant_a.hash_root = HASHER.root("tenant-a")
    run_prefill(bm, tenant_a)

    def salted(rid: str, salt: str) -> Sequence:
        seq = make_seq(rid, list(range(9)))
        seq.hash_root = HASHER.root(salt)
        return seq

    assert bm.match_prefix(salted("b", "tenant-a"))[0] == [0, 1]
    assert bm.match_prefix(salted("c", "tenant-b")) == ([], [])
    assert bm.match_prefix(salted("d", "")) == ([], [])  # unsalted is its own tenant


# -- allocate with hits ------------------------------------------------------------------------


def test_hits_on_running_pages_are_shared() -> None:
    bm = BlockManager(8, BT, HASHER)
    a = make_seq("a", list(range(9)))
    run_prefill(bm, a)
    assert a.block_table == [0, 1, 2]
    b = make_seq("b", [*range(8), 50, 51, 52])
    hits = bm.match_prefix(b)
    assert hits == ([0, 1], HASHER.chain(list(range(8)), BT))
    assert bm.can_allocate(b, 3, hits[0])
    bm.allocate(b, 3, hits)
    assert b.block_table == [0, 1, 3]
    assert b.block_hashes == hits[1]
    assert b.num_computed_tokens == 8
    assert b.num_cached_tokens == 8
    assert bm.pool.ref_counts[:5] == [2, 2, 1, 1, 0]
    assert bm.pool.free_order() == [4, 5, 6, 7]


def test_hits_on_free_cached_pages_revive_them() -> None:
    bm = BlockManager(4, BT, HASHER)
    a = make_seq("a", list(range(9)))
    run_prefill(bm, a)  # pages 0 1 2; 0 and 1 named
    bm.deallocate(a)
    assert bm.pool.free_order() == [3, 2, 1, 0]
    b = make_seq("b", list(range(9)))
    pages, hashes = bm.match_prefix(b)
    assert pages == [0, 1]
    # two revived pages and one fresh one are needed; 4 are free
    assert bm.can_allocate(b, 1, pages)
    bm.allocate(b, 1, PrefixHit(pages, hashes))
    assert b.block_table == [0, 1, 3]
    assert b.num_computed_tokens == 8
    assert b.num_cached_tokens == 8
    assert bm.pool.ref_counts == [1, 1, 0, 1]
    assert bm.pool.free_order() == [2]


def test_revived_pages_count_against_free_pages() -> None:
    bm = BlockManager(4, BT, HASHER)
    a = make_seq("a", list(range(9)))
    run_prefill(bm, a)
    bm.deallocate(a)  # free: [3, 2, 1, 0], pages 0 and 1 named
    hog = make_seq("hog", [7, 7])
    bm.allocate(hog, 2)  # takes page 3
    hog2 = make_seq("hog2", [8, 8])
    bm.allocate(hog2, 2)  # takes page 2
    assert bm.pool.free_order() == [1, 0]
    b = make_seq("b", list(range(9)))
    pages, _ = bm.match_prefix(b)
    assert pages == [0, 1]
    # two pages to revive and one fresh page: three, but only two are free
    assert not bm.can_allocate(b, 1, pages)


def test_hits_ignored_when_empty() -> None:
    bm = BlockManager(4, BT, HASHER)
    s = make_seq("a", list(range(5)))
    bm.allocate(s, 5, PrefixHit([], []))
    assert s.block_table == [0, 1]
    assert s.num_computed_tokens == 0


def test_can_allocate_counts_the_pages_after_prefix_hits() -> None:
    """Regression: _pages_needed once sized the fresh pages from num_computed_tokens (still 0
    before the hits are taken) and so forgot the hit tokens; can_allocate() said yes and
    allocate() raised RuntimeError."""
    bm = BlockManager(4, BT, HASHER)
    a = make_seq("a", list(range(9)))
    run_prefill(bm, a)  # a keeps pages 0 1 2 (0 and 1 named); only page 3 is free
    b = make_seq("b", [*range(8), 100, 101, 102, 103, 104, 105, 106, 107])
    pages, _ = bm.match_prefix(b)
    assert pages == [0, 1]
    n = b.num_tokens - len(pages) * BT  # 8 tokens after the hits: blocks 2 and 3 of b
    fits = bm.can_allocate(b, n, pages)
    assert not fits, "b needs 2 fresh pages after its 2 hit blocks and only 1 is free"


def test_can_allocate_agrees_with_allocate_after_hits_when_pages_suffice() -> None:
    bm = BlockManager(5, BT, HASHER)
    a = make_seq("a", list(range(9)))
    run_prefill(bm, a)  # pages 0 1 2 held; 3 and 4 free
    b = make_seq("b", [*range(8), 100, 101, 102, 103, 104, 105, 106, 107])
    pages, hashes = bm.match_prefix(b)
    assert bm.can_allocate(b, 8, pages)
    bm.allocate(b, 8, PrefixHit(pages, hashes))
    assert b.block_table == [0, 1, 3, 4]
    assert bm.pool.num_free == 0


# -- commit ------------------------------------------------------------------------------------


def test_commit_names_only_full_computed_blocks() -> None:
    bm = BlockManager(8, BT, HASHER)
    tokens = list(range(20, 31))  # 11 tokens: blocks 0 and 1 full, block 2 partial
    s = make_seq("a", tokens)
    bm.allocate(s, 11)
    s.num_computed_tokens = 5
    bm.commit(s)
    chain = HASHER.chain(tokens, BT)
    assert len(chain) == 2
    assert s.block_hashes == chain[:1]
    assert bm.pool.lookup(chain[0]) == s.block_table[0]
    assert bm.pool.lookup(chain[1]) is None
    assert bm.pool.block_hash[:3] == [chain[0], None, None]
    s.num_computed_tokens = 8
    bm.commit(s)
    assert s.block_hashes == chain
    assert bm.pool.block_hash[:3] == [*chain, None]
    s.num_computed_tokens = 11
    bm.commit(s)  # the partial block is never named
    assert s.block_hashes == chain
    assert bm.pool.block_hash[2] is None
    # once the tail fills up (with a sampled token) it is named too
    s.token_ids.append(31)
    s.num_computed_tokens = 12
    bm.commit(s)
    assert s.block_hashes == HASHER.chain([*tokens, 31], BT)
    assert bm.pool.lookup(s.block_hashes[2]) == s.block_table[2]


def test_commit_never_names_uncomputed_tokens() -> None:
    bm = BlockManager(8, BT, HASHER)
    s = make_seq("a", list(range(12)))
    bm.allocate(s, 12)
    s.num_computed_tokens = 3
    bm.commit(s)
    assert s.block_hashes == []
    assert bm.pool.block_hash == [None] * 8


def test_commit_after_hits_continues_the_chain() -> None:
    bm = BlockManager(8, BT, HASHER)
    run_prefill(bm, make_seq("a", list(range(9))))
    b = make_seq("b", [*range(8), 40, 41, 42, 43, 44])
    run_prefill(bm, b)
    assert b.num_cached_tokens == 8
    assert b.block_table[:2] == [0, 1]
    assert b.block_hashes == HASHER.chain(b.token_ids, BT)
    assert bm.pool.lookup(b.block_hashes[2]) == b.block_table[2]


def test_commit_of_duplicate_content_keeps_first_page() -> None:
    bm = BlockManager(8, BT, HASHER)
    a = make_seq("a", list(range(5)))
    b = make_seq("b", list(range(5)))
    bm.allocate(a, 5)
    bm.allocate(b, 5)  # computed side by side: no hits for b
    a.num_computed_tokens = b.num_computed_tokens = 5
    bm.commit(a)
    bm.commit(b)
    h = HASHER.chain(list(range(4)), BT)
    assert a.block_hashes == b.block_hashes == h
    assert bm.pool.lookup(h[0]) == a.block_table[0] == 0
    assert bm.pool.block_hash[b.block_table[0]] is None


def test_commit_with_share_moves_duplicate_blocks_onto_the_cached_pages() -> None:
    bm = BlockManager(8, BT, HASHER)
    a = make_seq("a", list(range(9)))
    b = make_seq("b", [*range(8), 99])  # same two full blocks, another tail
    bm.allocate(a, 9)
    bm.allocate(b, 9)  # reserved side by side: no hits for b
    a.num_computed_tokens = b.num_computed_tokens = 9
    bm.commit(a, share=True)  # nothing cached yet: a keeps its pages
    assert a.block_table == [0, 1, 2] and a.page_epoch == 0
    own = list(b.block_table)
    free_before = bm.pool.num_free
    named = bm.commit(b, share=True)
    h = HASHER.chain(list(range(8)), BT)
    assert named == [(h[0], 0), (h[1], 1)]
    assert b.block_table == [0, 1, own[2]] and b.block_hashes == h
    assert b.page_epoch == 1  # its block-table row is rewritten
    assert bm.pool.ref_counts[0] == bm.pool.ref_counts[1] == 2
    assert bm.pool.num_free == free_before + 2  # b's own copies went back
    assert all(bm.pool.ref_counts[p] == 0 for p in own[:2])
    bm.deallocate(a)
    bm.deallocate(b)
    assert bm.pool.num_free == 8


# -- deallocate --------------------------------------------------------------------------------


def test_deallocate_frees_last_block_first() -> None:
    bm = BlockManager(6, BT, HASHER)
    s = make_seq("a", list(range(9)))
    run_prefill(bm, s)
    s.num_cached_tokens = 3  # not the block manager's field to reset
    bm.deallocate(s)
    assert s.block_table == []
    assert s.block_hashes == []
    assert s.num_computed_tokens == 0
    assert bm.pool.free_order() == [3, 4, 5, 2, 1, 0]
    assert bm.pool.ref_counts == [0] * 6
    # names survive release until the page is taken again
    assert bm.pool.lookup(HASHER.chain(list(range(8)), BT)[1]) == 1


def test_shared_prefix_outlives_the_tail_under_eviction() -> None:
    bm = BlockManager(4, BT, HASHER)
    a = make_seq("a", list(range(12)))
    run_prefill(bm, a)  # pages 0 1 2, all full and named
    names = list(a.block_hashes)
    bm.deallocate(a)
    assert bm.pool.free_order() == [3, 2, 1, 0]
    other = make_seq("other", [50] * 8)
    bm.allocate(other, 8)
    assert other.block_table == [3, 2]  # the tail page 2 goes first, evicting its name
    assert bm.pool.lookup(names[2]) is None
    assert [bm.pool.lookup(h) for h in names[:2]] == [0, 1]
    b = make_seq("b", list(range(12)))
    assert bm.match_prefix(b) == ([0, 1], names[:2])


def test_deallocate_of_shared_pages_keeps_other_owner() -> None:
    bm = BlockManager(8, BT, HASHER)
    a = make_seq("a", list(range(9)))
    run_prefill(bm, a)
    b = make_seq("b", list(range(10)))
    run_prefill(bm, b)
    assert b.block_table == [0, 1, 3]
    bm.deallocate(a)
    assert bm.pool.ref_counts[:4] == [1, 1, 0, 1]
    assert bm.pool.free_order() == [4, 5, 6, 7, 2]
    bm.deallocate(b)
    assert bm.pool.free_order() == [4, 5, 6, 7, 2, 3, 1, 0]
    assert bm.pool.ref_counts == [0] * 8


def test_deallocate_empty_sequence() -> None:
    bm = BlockManager(2, BT, HASHER)
    s = make_seq("a", [1])
    bm.deallocate(s)
    assert bm.pool.free_order() == [0, 1]


# -- prefix caching off ------------------------------------------------------------------------


def test_prefix_caching_off() -> None:
    bm = BlockManager(8, BT, HASHER, prefix_caching=False)
    a = make_seq("a", list(range(9)))
    run_prefill(bm, a)
    assert a.block_hashes == []
    assert bm.pool.block_hash == [None] * 8
    # even a name put into the pool by hand is not matched
    bm.pool.cache(a.block_table[0], HASHER.chain(list(range(4)), BT)[0])
    b = make_seq("b", list(range(9)))
    assert bm.match_prefix(b) == ([], [])
    run_prefill(bm, b)
    assert b.num_cached_tokens == 0
    assert b.block_table == [3, 4, 5]


# -- property: match_prefix against a model of cached prefixes --------------------------------

token_lists = st.lists(st.integers(min_value=0, max_value=2), min_size=1, max_size=14)


@settings(max_examples=150, deadline=None)
@given(
    block_tokens=st.integers(min_value=1, max_value=4),
    donors=st.lists(token_lists, max_size=5),
    keep=st.lists(st.booleans(), min_size=5, max_size=5),
    prompt=token_lists,
)
def test_match_prefix_finds_the_longest_cached_prefix(
    block_tokens: int, donors: list[list[int]], keep: list[bool], prompt: list[int]
) -> None:
    # enough pages that nothing is ever evicted: the cache holds every full prefix computed
    bm = BlockManager(100, block_tokens, HASHER)
    cached: set[tuple[int, ...]] = set()
    held: list[Sequence] = []
    for i, tokens in enumerate(donors):
        s = make_seq(f"d{i}", tokens)
        run_prefill(bm, s)
        assert s.block_hashes == HASHER.chain(tokens, block_tokens)
        full = len(tokens) // block_tokens
        cached.update(tuple(tokens[: k * block_tokens]) for k in range(1, full + 1))
        if keep[i]:
            held.append(s)
        else:
            bm.deallocate(s)
    expected = 0
    while (expected + 1) * block_tokens <= len(prompt) - 1 and (
        tuple(prompt[: (expected + 1) * block_tokens]) in cached
    ):
        expected += 1
    s = make_seq("p", prompt)
    pages, hashes = bm.match_prefix(s)
    assert len(pages) == expected
    assert hashes == HASHER.chain(prompt, block_tokens)[:expected]
    assert [bm.pool.lookup(h) for h in hashes] == pages
    assert len(set(pages)) == len(pages)
    run_prefill(bm, s)
    assert s.num_cached_tokens == expected * block_tokens
    assert s.num_computed_tokens == len(prompt)
    assert len(set(s.block_table)) == len(s.block_table) == bm.blocks_for(len(prompt))
    for seq in [*held, s]:
        bm.deallocate(seq)
    assert bm.pool.num_free == bm.pool.num_blocks
    assert bm.pool.ref_counts == [0] * bm.pool.num_blocks


@settings(max_examples=150, deadline=None)
@given(
    block_tokens=st.integers(min_value=1, max_value=4),
    num_blocks=st.integers(min_value=1, max_value=8),
    requests=st.lists(st.tuples(token_lists, st.booleans()), min_size=1, max_size=8),
)
def test_can_allocate_is_exact_with_and_without_hits(
    block_tokens: int, num_blocks: int, requests: list[tuple[list[int], bool]]
) -> None:
    """can_allocate() says yes exactly when allocate() then succeeds."""
    bm = BlockManager(num_blocks, block_tokens, HASHER)
    held: list[Sequence] = []
    for i, (tokens, keep) in enumerate(requests):
        s = make_seq(f"r{i}", tokens)
        hits = bm.match_prefix(s)
        n = s.num_tokens - len(hits[0]) * block_tokens
        fits = bm.can_allocate(s, n, hits[0])
        if not fits:
            with pytest.raises(RuntimeError):
                bm.allocate(s, n, hits)
            return  # the pool is now half-changed: stop here
        bm.allocate(s, n, hits)
        assert len(s.block_table) == bm.blocks_for(s.num_tokens)
        assert len(set(s.block_table)) == len(s.block_table)
        s.num_computed_tokens += n
        bm.commit(s)
        if keep:
            held.append(s)
        else:
            bm.deallocate(s)
        assert sum(bm.pool.ref_counts) == sum(len(h.block_table) for h in held)
        assert bm.pool.num_free + bm.pool.num_used == num_blocks
    for s in held:
        bm.deallocate(s)
    assert bm.pool.num_free == num_blocks


def test_events_name_each_blocks_parent_in_the_chain() -> None:
    """Committed and pulled blocks are logged with their parents: the previous block, or
    the sequence's root for the first one."""
    bm = BlockManager(16, BT, HASHER)
    bm.pool.log_events()
    a = make_seq("a", list(range(3 * BT + 1)))
    run_prefill(bm, a)
    chain = HASHER.chain(a.token_ids, BT)
    assert bm.pool.take_events() == [
        Stored(chain[0], HASHER.unsalted_root),
        Stored(chain[1], chain[0]),
        Stored(chain[2], chain[1]),
    ]

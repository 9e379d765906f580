"""The kvserve connector's bookkeeping (``vllm_backend.plans``), exactly: what a lookup
offers, what a step loads and writes, under our engine's block names."""

from __future__ import annotations

from kvpool.hashing import Namespace, PrefixHasher
from vllm_backend.plans import LoadItem, Planner, Tracked

BT = 4
HASHER = PrefixHasher(Namespace("m@1", "float32", BT), b"root-key")


def tracked(
    prompt_len: int, *, handoff: bool = False, adopt: bool = False, salt: str = ""
) -> Tracked:
    return Tracked("rid-1", salt, handoff, adopt, prompt_len)


def names(tokens: list[int], salt: str = "") -> list[int]:
    full = len(tokens) // BT * BT
    return HASHER.chain(tokens[:full], BT, HASHER.root(salt))


def test_names_are_our_engines_chain_and_salted() -> None:
    planner, tokens = Planner(HASHER, BT), list(range(10, 23))
    assert planner.chain(tracked(13), tokens, 3) == names(tokens)
    assert planner.chain(tracked(13, salt="t"), tokens, 3) == names(tokens, "t")
    assert names(tokens, "t") != names(tokens)


def test_a_lookup_offers_pool_blocks_past_local_hits_never_the_last_tokens_block() -> None:
    planner, tokens = Planner(HASHER, BT), list(range(12))  # 3 full blocks
    asked: list[list[int]] = []

    def present(chain: list[int]) -> int:
        asked.append(chain)
        return len(chain)

    t = tracked(12)
    assert planner.match(t, tokens, 4, present, lambda rid: True) == 4  # block 1 only
    assert asked == [names(tokens)[1:2]]  # block 2 holds the last token: never offered
    assert t.match == (1, 1, 0)


def test_an_adopted_prompt_takes_its_partial_block_once_every_full_one_is_there() -> None:
    planner = Planner(HASHER, BT)
    prompt = list(range(10))  # 2 full blocks + 2 tokens
    tokens = [*prompt, 99]  # and the first token, made by the prefill worker
    t = tracked(10, adopt=True)
    assert planner.match(t, tokens, 0, len, lambda rid: rid == "rid-1") == 10
    assert t.match == (0, 2, 2)
    t2 = tracked(10, adopt=True)
    assert planner.match(t2, tokens, 0, lambda chain: 1, lambda rid: True) == 4  # a gap
    t3 = tracked(10)  # not adopted: no partial block
    assert planner.match(t3, tokens, 0, len, lambda rid: True) == 8


def test_a_load_takes_what_vllm_accepted() -> None:
    planner = Planner(HASHER, BT)
    prompt = list(range(10))
    t = tracked(10, adopt=True)
    planner.match(t, [*prompt, 7], 4, len, lambda rid: True)  # 1 local, 1 pool, partial
    pages = [30, 31, 32]
    item = planner.load("vllm-req", t, pages, 6)
    assert item == LoadItem("vllm-req", "rid-1", names(prompt)[1:2], [31, 32], names(prompt)[:1], 2)
    assert item.tokens(2, BT) == 6 and item.tokens(1, BT) == 4 and item.tokens(0, BT) == 0
    assert planner.load("vllm-req", t, pages, 4) == LoadItem(
        "vllm-req", "rid-1", names(prompt)[1:2], [31], names(prompt)[:1], 0
    )  # vLLM took the full block only
    assert planner.load("vllm-req", t, pages, 0) is None


def test_each_step_writes_the_blocks_it_completes_once() -> None:
    planner = Planner(HASHER, BT)
    tokens = list(range(9))
    t = tracked(9)
    pages = [5, 6, 7]
    first = planner.write(t, tokens, 0, 6, pages)  # computes tokens 0..5: block 0 complete
    assert first is not None and first.blocks == [(names(tokens)[0], 5)] and first.parent is None
    second = planner.write(t, tokens, 6, 3, pages)  # tokens 6..8: block 1 complete
    assert second is not None and second.blocks == [(names(tokens)[1], 6)]
    assert second.parent == names(tokens)[0] and second.partial is None
    assert planner.write(t, [*tokens, 50], 9, 1, pages) is None  # nothing new completes


def test_a_block_whose_last_token_is_still_sampled_waits_a_step() -> None:
    planner, t = Planner(HASHER, BT), tracked(3)
    pages = [1, 2]
    assert planner.write(t, [1, 2, 3], 0, 3, pages) is None
    assert planner.write(t, [1, 2, 3], 3, 1, pages) is None  # token 3 not known yet
    later = planner.write(t, [1, 2, 3, 4], 4, 1, pages)
    assert later is not None and later.blocks == [(names([1, 2, 3, 4])[0], 1)]


def test_a_handoff_writes_its_whole_prompt_and_its_partial_block() -> None:
    planner = Planner(HASHER, BT)
    prompt = list(range(10))
    t = tracked(10, handoff=True)
    t.written = None
    intent = planner.write(t, prompt, 8, 2, [4, 5, 6])  # 2 blocks held locally, 2 computed
    assert intent is not None
    assert intent.blocks == list(zip(names(prompt), [4, 5], strict=True))
    assert intent.parent is None and intent.partial == (6, 2) and intent.request_id == "rid-1"

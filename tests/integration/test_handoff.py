"""Prefill on one engine, decode on another, the KV moving through a real pool.

Both engines live in this process (the gRPC path is covered end to end in tests/e2e);
what is checked here is the engine side of the hand-off: reservation, layer-wise writes,
landing (or a pull after prefill), adoption, exact tokens, and every page coming back.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvpool.landing import STALL_S
from kvpool.master import MasterConfig
from kvpool.store import FAILED
from kvserve.bench.handoff import handoff, run_until_first
from tests.integration.pool_fixtures import pool_config, running_master
from tests.integration.reference import hf_greedy
from workers.config import EngineConfig
from workers.core.sequence import SamplingParams
from workers.engine.engine import Engine
from workers.handoff.arrival import LANDING_WAIT_S
from workers.handoff.pool_transfer import prompt_targets

pytestmark = pytest.mark.kv_path

GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MasterConfig]:
    with running_master(tmp_path_factory.mktemp("master")) as cfg:
        yield cfg


def make_engine(model_dir: Path, master: MasterConfig, streaming: bool) -> Engine:
    config = EngineConfig(
        model=str(model_dir),
        block_tokens=16,
        num_kv_blocks=64,
        max_num_batched_tokens=48,  # several chunks per prompt: writes span steps
        kv_streaming=streaming,
    )
    engine = Engine(config, pool_config(master))
    assert engine.pool is not None
    return engine


@pytest.fixture(scope="module", params=[True, False], ids=["streaming", "after-prefill"])
def pair(
    request: pytest.FixtureRequest, tiny_model_dir: Path, master: MasterConfig
) -> Iterator[tuple[Engine, Engine]]:
    prefill = make_engine(tiny_model_dir, master, request.param)
    decode = make_engine(tiny_model_dir, master, request.param)
    yield prefill, decode
    prefill.close()
    decode.close()


def prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(49152) for _ in range(n)]


def idle(engine: Engine) -> bool:
    return engine.num_free_blocks == engine.num_blocks and not engine.reservations


@pytest.mark.parametrize("length", [7, 32, 77])  # partial only, aligned, full + partial
def test_handed_off_request_decodes_exactly(
    pair: tuple[Engine, Engine], tiny_model_dir: Path, length: int
) -> None:
    prefill, decode = pair
    ids = prompt(length, length)
    out = handoff(prefill, decode, f"h{length}", ids, GREEDY)
    assert out.output_token_ids == hf_greedy(tiny_model_dir, ids, GREEDY.max_tokens)
    assert out.text == decode.tokenizer.decode(out.output_token_ids)
    assert decode.pool is not None
    layout = decode.pool.layout
    blocks = -(-length // layout.block_tokens)
    assert out.read.bytes == blocks * layout.num_layers * layout.span_bytes
    assert idle(prefill) and idle(decode)
    # The decode engine computed no prompt token itself: all of it came from the pool.
    assert decode.stats.prompt_tokens_computed == 0


def test_seeded_sampling_matches_a_colocated_run(
    pair: tuple[Engine, Engine], tiny_model_dir: Path
) -> None:
    prefill, decode = pair
    ids = prompt(5, 40)
    params = SamplingParams(max_tokens=8, temperature=1.0, top_p=0.9, seed=1234, ignore_eos=True)
    (colocated,) = prefill.generate([ids], params)
    out = handoff(prefill, decode, "seeded", ids, params)
    assert out.output_token_ids == colocated.output_token_ids


def test_reservation_lease_expires_and_returns_its_pages(pair: tuple[Engine, Engine]) -> None:
    _, decode = pair
    seq = decode.reserve("never-prefilled", prompt(9, 50), 4, lease_s=0.0)
    assert seq is not None and decode.num_free_blocks < decode.num_blocks
    assert decode.housekeeping() == 1
    assert idle(decode)


def test_adopt_without_reservation_recomputes_what_the_pool_lacks(
    pair: tuple[Engine, Engine], tiny_model_dir: Path
) -> None:
    prefill, decode = pair
    ids = prompt(11, 45)
    (first,) = prefill.generate([ids], SamplingParams(max_tokens=1, temperature=0))
    decode.adopt("no-reservation", ids, first.output_token_ids[0], GREEDY)
    outs = []
    while decode.has_unfinished:
        outs += [o for o in decode.step() if o.request_id == "no-reservation"]
    tokens = [first.output_token_ids[0]] + [t for o in outs for t in o.new_token_ids]
    assert tokens[: GREEDY.max_tokens] == hf_greedy(tiny_model_dir, ids, GREEDY.max_tokens)
    assert idle(decode)


def test_abort_releases_a_reservation_and_its_landing(pair: tuple[Engine, Engine]) -> None:
    _, decode = pair
    assert decode.reserve("aborted", prompt(13, 60), 4, lease_s=30.0) is not None
    assert decode.abort("aborted")
    assert idle(decode) and decode.reservations.landing("aborted") is None


def test_concurrent_reservations_over_one_prefix_end_up_on_one_copy(
    pair: tuple[Engine, Engine], tiny_model_dir: Path
) -> None:
    """Both reserved before either prefill (no local hit possible): at adoption the second
    moves onto the first's prefix pages, gives its own back, and both decode exactly."""
    prefill, decode = pair
    shared = prompt(21, 32)  # two full blocks of 16
    prompts = {f"share{i}": shared + prompt(22 + i, 9) for i in range(2)}
    for rid, ids in prompts.items():
        assert decode.reserve(rid, ids, GREEDY.max_tokens, 60.0) is not None
    firsts = {}
    for rid, ids in prompts.items():
        prefill.add_request(ids, GREEDY, rid, handoff=True)
        firsts[rid] = run_until_first(prefill, rid).new_token_ids[0]
    for rid, ids in prompts.items():
        landing = decode.reservations.landing(rid)
        if landing is not None:
            decode.reservations.nudge()
            assert landing.done.wait(30.0)
        decode.adopt(rid, ids, firsts[rid], GREEDY)
    tables = [list(s.block_table) for s in decode.scheduler.running]
    assert len(tables) == 2 and tables[0][:2] == tables[1][:2]
    assert tables[0][2] != tables[1][2]
    assert decode.num_blocks - decode.num_free_blocks == 4  # not 6: one copy of the prefix
    tokens = {rid: [first] for rid, first in firsts.items()}
    while decode.has_unfinished:
        for out in decode.step():
            tokens[out.request_id] += out.new_token_ids
    for rid, ids in prompts.items():
        assert tokens[rid] == hf_greedy(tiny_model_dir, ids, GREEDY.max_tokens)
    assert idle(prefill) and idle(decode)


def test_a_block_that_never_lands_costs_a_stall_and_only_its_own_recompute(
    pair: tuple[Engine, Engine], tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One layer put of the prompt's third block fails (a full pool), so that block is never
    committed: the decode side waits as the servicer does (until the landing is over or
    stalls), keeps the two leading blocks, recomputes the other 45 of 77 prompt tokens, well
    before the old fixed 10 s wait, and decodes exactly."""
    prefill, decode = pair
    rid, ids = "lost-block", prompt(31, 77)  # 4 full blocks of 16 + a partial one
    seq = decode.reserve(rid, ids, GREEDY.max_tokens, 60.0)
    assert seq is not None and prefill.pool is not None and decode.pool is not None
    named, _ = prompt_targets(decode.scheduler.blocks, seq)
    lost = f"{decode.pool.keys.meta_key(named[2][0])}/1"
    store = prefill.pool.store
    put_from = store.put_from

    def full_pool(keys: list[str], ptrs: list[int], sizes: list[int]) -> list[int]:
        kept = [i for i, key in enumerate(keys) if key != lost]
        codes = put_from([keys[i] for i in kept], [ptrs[i] for i in kept], [sizes[i] for i in kept])
        out = [FAILED] * len(keys)
        for i, code in zip(kept, codes, strict=True):
            out[i] = code
        return out

    monkeypatch.setattr(store, "put_from", full_pool)
    prefill.add_request(ids, GREEDY, rid, handoff=True)
    first = run_until_first(prefill, rid).new_token_ids[0]
    t0 = time.monotonic()
    landing = decode.reservations.landing(rid)
    if landing is not None:  # streaming: as the servicer's Generate with first_token waits
        decode.reservations.nudge()
        assert not landing.settle(STALL_S, LANDING_WAIT_S)
    assert time.monotonic() - t0 < LANDING_WAIT_S / 2
    computed = decode.stats.prompt_tokens_computed
    decode.adopt(rid, ids, first, GREEDY)
    assert seq.num_pool_tokens == 32 and seq.num_computed_tokens == 32
    tokens = [first]
    while decode.has_unfinished:
        tokens += [t for o in decode.step() if o.request_id == rid for t in o.new_token_ids]
    assert decode.stats.prompt_tokens_computed - computed == 77 - 32
    assert tokens == hf_greedy(tiny_model_dir, ids, GREEDY.max_tokens)
    assert idle(prefill) and idle(decode)

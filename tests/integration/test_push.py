"""Direct push: prefill on one engine writes the prompt's KV straight into the decode
engine's reserved pages through a transfer engine of its own; the pool is written in the
background.

Both engines live in this process, each a real pool member of a real ``mooncake_master``
(the gRPC path and a decode worker that dies during a push: tests/integration/
test_push_faults.py). Checked here: exact tokens against transformers and against the pool
path, what reaches the pool (full blocks, no partial one), the fallback to the pool when
the push is refused, forged metas and altered pages recomputed, and every page back,
including a push reservation's after its quarantine. The engines move their KV in place
whatever ``KVSERVE_KV_STAGING`` says (a staged cache takes no push).
"""

from __future__ import annotations

import ctypes
import dataclasses
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from kvpool.master import MasterConfig
from kvpool.meta import BlockMeta, digest_bytes
from kvpool.pool import KVPool
from kvpool.push import PushTarget, target_mac
from kvserve.bench.handoff import handoff, run_until_first
from tests.integration.pool_fixtures import pool_config, running_master
from tests.integration.reference import hf_greedy
from workers.config import EngineConfig
from workers.core.outputs import RequestOutput
from workers.core.sequence import SamplingParams
from workers.engine.engine import Engine
from workers.handoff.push_receive import PushCheck, PushVerdict
from workers.handoff.push_state import PushJob
from workers.handoff.pusher import Pusher
from workers.handoff.reservations import PUSH_QUARANTINE_S

pytestmark = pytest.mark.kv_path

GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MasterConfig]:
    with running_master(tmp_path_factory.mktemp("master")) as cfg:
        yield cfg


def make_engine(model_dir: Path, master: MasterConfig) -> Engine:
    config = EngineConfig(
        model=str(model_dir),
        block_tokens=16,
        num_kv_blocks=64,
        max_num_batched_tokens=48,  # several chunks per prompt: pushes span steps
    )
    engine = Engine(config, dataclasses.replace(pool_config(master), kv_staging="never"))
    assert engine.pool is not None
    return engine


@pytest.fixture(scope="module")
def pair(tiny_model_dir: Path, master: MasterConfig) -> Iterator[tuple[Engine, Engine]]:
    prefill = make_engine(tiny_model_dir, master)
    decode = make_engine(tiny_model_dir, master)
    yield prefill, decode
    prefill.close()
    decode.close()


def prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(49152) for _ in range(n)]


def settle(engine: Engine) -> None:
    """Let the background pool writes end and their pages come back."""
    assert engine.prefill is not None and engine.prefill.pusher is not None
    engine.prefill.flush()
    engine.prefill.unpin()


def pool_block_verifies(pool: KVPool, block_hash: int) -> bool:
    """Whether the pool's copy of a block passes a reader's checks (MAC, every layer's
    digest), read into bytes here (no page is touched)."""
    key = pool.keys.meta_key(block_hash)
    meta = pool.codec.decode(pool.store.get_bytes([key])[0], key)
    layers = pool.store.get_bytes(pool.keys.layer_keys(key))
    sums = [digest_bytes(pool.namespace.algorithm, layer) for layer in layers]
    return isinstance(meta, BlockMeta) and sums == meta.sums


def idle(engine: Engine) -> bool:
    return engine.num_free_blocks == engine.num_blocks and not engine.reservations


def adopt_and_decode(
    decode: Engine, rid: str, ids: list[int], first: RequestOutput, verdict: PushVerdict
) -> list[int]:
    """``decode`` adopts ``rid`` after the remote prefill's ``first`` output (its pushed
    pages judged by ``verdict``) and decodes it to the end: every output token."""
    decode.adopt(rid, ids, first.new_token_ids[0], GREEDY, pushed=verdict)
    tokens = list(first.new_token_ids)
    while decode.has_unfinished:
        tokens += [t for out in decode.step() if out.request_id == rid for t in out.new_token_ids]
    return tokens


def hold_last_pushes(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Hold back every push of a prompt's last step until the returned event is set."""
    gate = threading.Event()
    push_layer = Pusher.push_layer

    def held_back(self: Pusher, jobs: list[PushJob], layer: int) -> None:
        if any(job.final for job in jobs):
            gate.wait(60)
        push_layer(self, jobs, layer)

    monkeypatch.setattr(Pusher, "push_layer", held_back)
    return gate


@pytest.mark.parametrize("length", [7, 32, 77])  # partial only, aligned, full + partial
def test_pushed_request_decodes_exactly(
    pair: tuple[Engine, Engine], tiny_model_dir: Path, length: int
) -> None:
    prefill, decode = pair
    assert prefill.pool is not None and decode.pool is not None
    ids = prompt(100 + length, length)
    computed = decode.stats.prompt_tokens_computed
    out = handoff(prefill, decode, f"p{length}", ids, GREEDY, push=True)
    assert out.push is not None and out.push.ok, out.push
    assert out.output_token_ids == hf_greedy(tiny_model_dir, ids, GREEDY.max_tokens)
    layout = decode.pool.layout
    blocks = -(-length // layout.block_tokens)
    assert len(out.push.metas) == blocks
    assert out.read.bytes == blocks * layout.num_layers * layout.span_bytes
    assert decode.stats.prompt_tokens_computed == computed  # all of it was pushed
    settle(prefill)
    assert idle(prefill) and idle(decode)
    # The full blocks reached the pool in the background; the partial one did not.
    full = length // layout.block_tokens
    chain = prefill.hasher.chain(ids[: full * layout.block_tokens], layout.block_tokens)
    assert decode.pool.lookup(chain) == full
    assert all(pool_block_verifies(decode.pool, h) for h in chain)
    request_key = prefill.pool.keys.request_key(f"p{length}")
    assert decode.pool.store.exists([request_key]) == [0]


def test_push_and_pool_give_the_same_seeded_tokens(pair: tuple[Engine, Engine]) -> None:
    prefill, decode = pair
    params = SamplingParams(max_tokens=8, temperature=1.0, top_p=0.9, seed=77, ignore_eos=True)
    ids = prompt(5, 53)
    by_pool = handoff(prefill, decode, "seeded-pool", ids, params)
    by_push = handoff(prefill, decode, "seeded-push", prompt(5, 53), params, push=True)
    assert by_pool.push is None and by_push.push is not None and by_push.push.ok
    assert by_push.output_token_ids == by_pool.output_token_ids
    settle(prefill)
    assert idle(prefill) and idle(decode)


def test_a_refused_push_falls_back_to_the_pool(
    pair: tuple[Engine, Engine], tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The target names a segment nobody serves: the first layer's push fails, nothing more
    is pushed, the prefill waits for its pool writes (partial block included), and the decode
    side, given no metas, reads the pool: exact tokens, no prompt token computed there."""
    prefill, decode = pair
    real = decode.reservations.push_target

    def elsewhere(request_id: str) -> PushTarget | None:  # MAC'd as the decode side would
        target = real(request_id)
        if target is None or decode.pool is None:
            return None
        target = dataclasses.replace(target, segment="127.0.0.1:1")
        mac = target_mac(decode.pool.keys.block_key, request_id, target)
        return dataclasses.replace(target, mac=mac)

    monkeypatch.setattr(decode.reservations, "push_target", elsewhere)
    ids = prompt(41, 61)
    computed = decode.stats.prompt_tokens_computed
    out = handoff(prefill, decode, "refused", ids, GREEDY, push=True)
    assert out.push is not None and not out.push.ok and "refused" in out.push.error
    assert out.output_token_ids == hf_greedy(tiny_model_dir, ids, GREEDY.max_tokens)
    assert decode.stats.prompt_tokens_computed == computed
    settle(prefill)
    assert idle(prefill) and idle(decode)


def tamper_before_check(
    decode: Engine,
    monkeypatch: pytest.MonkeyPatch,
    tamper: Callable[[PushCheck, list[bytes]], None],
) -> None:
    """Have ``tamper(check, metas)`` run just before the decode engine's push check does
    (with no watch: every block is checked then)."""
    monkeypatch.setattr(decode.reservations, "_watch", lambda held: None)
    real = decode.reservations.push_check

    class Tampered(PushCheck):
        def run(self, metas: Sequence[bytes]) -> PushVerdict:
            changed = list(metas)
            tamper(self, changed)
            return super().run(changed)

    def push_check(request_id: str) -> PushCheck | None:
        check = real(request_id)
        return check and Tampered(check.pool, check.seq, check.fills, check.block_tokens)

    monkeypatch.setattr(decode.reservations, "push_check", push_check)


def test_forged_metas_and_altered_pages_are_recomputed(
    pair: tuple[Engine, Engine], tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Block 1's meta arrives with a wrong MAC: block 0 is kept, blocks 1.. recomputed. Then
    a page altered after the push (a stray write): its block and the later ones recomputed.
    Tokens stay exact both times."""
    prefill, decode = pair
    assert decode.pool is not None
    forged0 = decode.pool.stats.forged_blocks
    bt = decode.pool.layout.block_tokens

    def forge(_: PushCheck, metas: list[bytes]) -> None:
        metas[1] = metas[1].replace(b'"mac":"', b'"mac":"0', 1)

    tamper_before_check(decode, monkeypatch, forge)
    ids = prompt(51, 70)
    computed = decode.stats.prompt_tokens_computed
    out = handoff(prefill, decode, "forged", ids, GREEDY, push=True)
    assert out.output_token_ids == hf_greedy(tiny_model_dir, ids, GREEDY.max_tokens)
    assert decode.pool.stats.forged_blocks == forged0 + 1
    assert decode.stats.prompt_tokens_computed == computed + len(ids) - bt

    checksum0 = decode.pool.stats.checksum_failures

    def alter(check: PushCheck, _: list[bytes]) -> None:
        page = check.seq.block_table[2]
        byte = ctypes.c_uint8.from_address(check.pool.slab_ptr + check.pool.layout.offset(1, page))
        byte.value ^= 0xFF

    tamper_before_check(decode, monkeypatch, alter)
    ids = prompt(52, 70)
    computed = decode.stats.prompt_tokens_computed
    out = handoff(prefill, decode, "altered", ids, GREEDY, push=True)
    assert out.output_token_ids == hf_greedy(tiny_model_dir, ids, GREEDY.max_tokens)
    assert decode.pool.stats.checksum_failures == checksum0 + 1
    assert decode.stats.prompt_tokens_computed == computed + len(ids) - 2 * bt
    settle(prefill)
    assert idle(prefill) and idle(decode)


def test_a_target_altered_on_the_way_is_refused(
    pair: tuple[Engine, Engine], tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The router (or anyone between) moves the target's pages: the MAC fails, the prefill
    engine writes nothing there, and the KV goes through the pool."""
    prefill, decode = pair
    real = decode.reservations.push_target

    def moved(request_id: str) -> PushTarget | None:
        target = real(request_id)
        return target and dataclasses.replace(target, pages=target.pages[::-1])

    monkeypatch.setattr(decode.reservations, "push_target", moved)
    ids = prompt(53, 70)
    out = handoff(prefill, decode, "moved", ids, GREEDY, push=True)
    assert out.push is not None and not out.push.ok and "MAC" in out.push.error
    assert out.output_token_ids == hf_greedy(tiny_model_dir, ids, GREEDY.max_tokens)
    settle(prefill)
    assert idle(prefill) and idle(decode)


def test_pushed_blocks_are_verified_while_the_prefill_runs(
    pair: tuple[Engine, Engine], tiny_model_dir: Path
) -> None:
    """Once the prefill engine published a step's blocks, the decode engine's watch checks
    its pages of them: with every block published before adoption, the check at adoption
    digests only the partial last block."""
    prefill, decode = pair
    assert prefill.prefill is not None and prefill.prefill.pusher is not None
    ids, rid = prompt(81, 77), "watched"  # 4 full blocks over several steps + a partial one
    assert decode.reserve(rid, ids, GREEDY.max_tokens, 60.0, offer_push=True) is not None
    watch = decode.reservations._held[rid].watch
    assert watch is not None
    prefill.add_request(ids, GREEDY, rid, handoff=True, push=decode.push_target(rid))
    first = run_until_first(prefill, rid)
    assert first.push is not None
    pushed = first.push.result(60)
    assert pushed.ok
    prefill.prefill.flush()  # every full block's meta is in the pool now
    assert watch.done.wait(30) and watch.count == 4
    check = decode.arrived(rid, pushed=True).check
    assert check is not None and check.skip == 4
    verdict = check.run(pushed.metas)
    assert verdict.tokens == len(ids)
    tokens = adopt_and_decode(decode, rid, ids, first, verdict)
    assert tokens == hf_greedy(tiny_model_dir, ids, GREEDY.max_tokens)
    settle(prefill)
    assert idle(prefill) and idle(decode)


def test_a_salted_prompt_is_pushed_under_its_salts_names(
    pair: tuple[Engine, Engine], tiny_model_dir: Path
) -> None:
    """Both sides name the blocks from the request's salted root: every pushed block
    verifies (nothing recomputed) and the pool gets them under the salted names only."""
    prefill, decode = pair
    assert prefill.pool is not None
    ids, rid, salt = prompt(91, 70), "salted", "tenant\0x"
    assert decode.reserve(rid, ids, 4, 60.0, salt, offer_push=True) is not None
    prefill.add_request(ids, GREEDY, rid, True, salt, decode.push_target(rid))
    first = run_until_first(prefill, rid)
    assert first.push is not None
    pushed = first.push.result(60)
    assert pushed.ok
    check = decode.arrived(rid, pushed=True).check
    assert check is not None and check.run(pushed.metas).tokens == len(ids)
    decode.adopt(rid, ids, first.new_token_ids[0], GREEDY, salt, check.run(pushed.metas))
    computed = decode.stats.prompt_tokens_computed
    while decode.has_unfinished:
        decode.step()
    assert decode.stats.prompt_tokens_computed == computed
    settle(prefill)
    bt = prefill.pool.layout.block_tokens
    full = ids[: len(ids) // bt * bt]
    assert prefill.pool.lookup(prefill.hasher.chain(full, bt, prefill.hasher.root(salt))) == 4
    assert prefill.pool.lookup(prefill.hasher.chain(full, bt)) == 0
    assert idle(prefill) and idle(decode)


def test_an_ended_push_reservation_keeps_its_pages_for_the_quarantine(
    pair: tuple[Engine, Engine],
) -> None:
    _, decode = pair
    assert decode.reserve("quarantined", prompt(61, 50), 4, 30.0, offer_push=True) is not None
    assert decode.push_target("quarantined") is not None
    assert decode.abort("quarantined")
    assert not decode.reservations and decode.num_free_blocks < decode.num_blocks
    decode.housekeeping(time.monotonic() + PUSH_QUARANTINE_S / 2)
    assert decode.num_free_blocks < decode.num_blocks
    decode.housekeeping(time.monotonic() + PUSH_QUARANTINE_S + 1)
    assert idle(decode)


def test_a_target_is_taken_once_and_never_after_its_lease(pair: tuple[Engine, Engine]) -> None:
    """A relayer replays a target that was pushed to (its pages have been the request's
    since, and later anyone's), and one the decode engine made longer ago than its lease,
    arriving now: the prefill engine writes into neither (the pool carries their KV)."""
    prefill, decode = pair
    assert decode.pool is not None
    ids, rid = prompt(101, 40), "replayed"
    assert decode.reserve(rid, ids, GREEDY.max_tokens, 60.0, offer_push=True) is not None
    made = decode.push_target(rid)
    assert made is not None
    prefill.add_request(ids, GREEDY, rid, handoff=True, push=made)
    first = run_until_first(prefill, rid)
    assert first.push is not None
    pushed = first.push.result(60)
    assert pushed.ok
    assert decode.abort(rid)
    settle(prefill)
    replays = [(rid, made)]
    old = dataclasses.replace(made, issued_ms=made.issued_ms - 61_000)  # lease: 60 s
    replays.append(
        ("old", dataclasses.replace(old, mac=target_mac(decode.pool.keys.block_key, "old", old)))
    )
    errors = []
    for replay_id, target in replays:
        prefill.add_request(ids, GREEDY, replay_id, handoff=True, push=target)
        out = run_until_first(prefill, replay_id)
        assert out.push is not None
        refused = out.push.result(60)
        assert not refused.ok
        errors.append(refused.error)
        prefill.abort(replay_id)
    assert "taken before" in errors[0] and "lease is over" in errors[1]
    settle(prefill)
    decode.housekeeping(time.monotonic() + 61 + PUSH_QUARANTINE_S)
    assert idle(prefill) and idle(decode)


def test_a_reservation_without_offer_lands_from_the_pool(pair: tuple[Engine, Engine]) -> None:
    _, decode = pair
    assert decode.reserve("no-offer", prompt(71, 50), 4, 30.0) is not None
    assert decode.push_target("no-offer") is None
    assert decode.reservations.landing("no-offer") is not None
    assert decode.abort("no-offer") and idle(decode)


@pytest.mark.parametrize("after_token", [False, True], ids=["layerwise", "after_token"])
def test_the_first_token_does_not_wait_for_the_push(
    pair: tuple[Engine, Engine],
    tiny_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    after_token: bool,
) -> None:
    """The prompt's last step answers its first token while its layers are still being
    pushed (here: held back until the token is out), whether they were queued layer by
    layer or all after the token (``kv_push_timing``); how the push went comes after, with
    the KV that step moved, and the decode engine then goes on from the pushed pages."""
    prefill, decode = pair
    assert prefill.prefill is not None and prefill.prefill.pusher is not None
    monkeypatch.setattr(prefill.prefill.pusher, "after_token", after_token)
    gate = hold_last_pushes(monkeypatch)
    ids, rid = prompt(91 + after_token, 77), f"early-{after_token}"  # nothing cached
    assert decode.reserve(rid, ids, GREEDY.max_tokens, 60.0, offer_push=True) is not None
    prefill.add_request(ids, GREEDY, rid, handoff=True, push=decode.push_target(rid))
    first = run_until_first(prefill, rid)
    assert first.push is not None and not first.push.done()  # answered before its push
    gate.set()
    pushed = first.push.result(60)
    assert pushed.ok and pushed.bytes > 0
    layout = decode.pool.layout if decode.pool is not None else None
    assert layout is not None and len(pushed.metas) == -(-len(ids) // layout.block_tokens)
    check = decode.arrived(rid, pushed=True).check
    assert check is not None
    verdict = check.run(pushed.metas)
    assert verdict.tokens == len(ids)  # every pushed page verifies
    tokens = adopt_and_decode(decode, rid, ids, first, verdict)
    assert tokens == hf_greedy(tiny_model_dir, ids, GREEDY.max_tokens)
    settle(prefill)
    assert idle(prefill) and idle(decode)


def test_a_push_answer_nobody_waits_for_leaves_the_others_answered(
    pair: tuple[Engine, Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two hand-offs end their prompts in one step; the first one's answer is given up
    (its ``Prefill`` call ended: the router cancels it when the first token finished the
    request): the second's push is still answered, and every page comes back."""
    prefill, decode = pair
    gate = hold_last_pushes(monkeypatch)
    rids, prompts = ["left", "kept"], [prompt(95, 20), prompt(96, 20)]  # one step: 40 <= 48
    for rid, ids in zip(rids, prompts, strict=True):
        assert decode.reserve(rid, ids, GREEDY.max_tokens, 60.0, offer_push=True) is not None
        prefill.add_request(ids, GREEDY, rid, handoff=True, push=decode.push_target(rid))
    firsts = {out.request_id: out for out in prefill.step()}
    assert set(firsts) == set(rids)
    left, kept = (firsts[rid].push for rid in rids)
    assert left is not None and kept is not None and left.cancel()
    gate.set()
    assert kept.result(30).ok
    for rid in rids:
        assert decode.abort(rid)
    settle(prefill)
    decode.housekeeping(time.monotonic() + PUSH_QUARANTINE_S + 1)  # aborted push pages
    assert idle(prefill) and idle(decode)

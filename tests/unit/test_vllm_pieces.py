"""The pure parts of the vLLM backend, exactly: vLLM's cache under our names, its cache
layouts seen in the wire order, our settings as vLLM's arguments, reservations, the
outputs a call releases, the connector's spec and the worker's state."""

from __future__ import annotations

import asyncio
import json
import stat
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch

from kvpool.config import PoolConfig
from kvpool.hashing import Namespace, PrefixHasher
from kvpool.span_io import CacheSpan
from proto.kv_events import Removed, Stored
from proto.registry import ClusterConfig
from vllm_backend.args import cpu_binding, engine_kwargs, sampling_kwargs
from vllm_backend.cache_names import CacheNames
from vllm_backend.layouts import LayoutError, VllmViews, detect, read_span
from vllm_backend.outputs import CallOutputs, prompt_logprobs
from vllm_backend.reservations import ReservationBook
from vllm_backend.spec import ConnectorSpec
from vllm_backend.state import WorkerState
from workers.config import EngineConfig, VllmOptions
from workers.core.sequence import FinishReason, SamplingParams, TokenLogprob

BT = 4
HASHER = PrefixHasher(Namespace("m@1", "float32", BT), b"k")


def chain(tokens: list[int], salt: str = "") -> list[int]:
    return HASHER.chain(tokens, BT, HASHER.root(salt))


# -- vLLM's cache under our names -------------------------------------------------------
def test_vllm_events_become_ours_under_our_chain() -> None:
    names = CacheNames(HASHER, BT)
    names.stored(["a", "b"], None, list(range(8)), [("salt",), None])
    names.stored(["c"], "b", list(range(8, 12)), None)
    ours = chain(list(range(12)), "salt")
    assert names.take_events() == [
        Stored(ours[0], HASHER.root("salt")),
        Stored(ours[1], ours[0]),
        Stored(ours[2], ours[1]),
    ]
    assert names.holds(ours) == 3 and names.cached_names() == ours
    names.removed(["b", "zz"])
    assert names.take_events() == [Removed(ours[1])]
    names.cleared()
    assert sorted(e.hash for e in names.take_events()) == sorted([ours[0], ours[2]])
    assert names.cached_names() == []


def test_unnameable_blocks_are_left_out() -> None:
    names = CacheNames(HASHER, BT)
    names.stored(["x"], "unknown-parent", [1, 2, 3, 4])
    names.stored(["y"], None, [1, 2, 3, 4], [("lora", ("mm", 0))])
    assert names.take_events() == [] and names.unnamed == 2


# -- cache layouts ------------------------------------------------------------------------
def cpu_writer(key: torch.Tensor, value: torch.Tensor, cache: torch.Tensor) -> None:
    """What vLLM's CPU kernels store: per head, K transposed [head, tokens], V [tokens, head]."""
    heads, tokens, width = cache.shape[1:]
    halves = cache.view(cache.shape[0], heads, 2, tokens * (width // 2))
    halves[0, :, 0] = key.permute(1, 2, 0).reshape(heads, -1)
    halves[0, :, 1] = value.permute(1, 0, 2).reshape(heads, -1)


def token_kv_writer(key: torch.Tensor, value: torch.Tensor, cache: torch.Tensor) -> None:
    cache[0] = torch.cat([key, value], dim=-1).permute(1, 0, 2)


def test_the_layout_is_found_by_what_vllm_writes_and_reads_back_exactly() -> None:
    cache = torch.zeros(3, 2, BT, 2 * 8)
    assert detect(cache, cpu_writer) == "k-transposed"
    assert detect(cache, token_kv_writer) == "token-kv"
    with pytest.raises(LayoutError, match="none of the ways"):
        detect(cache, lambda k, v, c: None)  # writes nothing: nothing reads back
    with pytest.raises(LayoutError, match="dtype"):
        detect(cache.to(torch.float64), cpu_writer)


def test_views_move_spans_in_the_wire_order_both_ways() -> None:
    caches = [torch.zeros(3, 2, BT, 16) for _ in range(2)]
    views = VllmViews("k-transposed", caches)
    kv = torch.randn(2, BT, 2, 8)
    cpu_writer(kv[0], kv[1], caches[1][2:3])  # layer 1, block 2
    assert torch.equal(read_span(views(CacheSpan(1, 2))), kv)
    for part, half in zip(views(CacheSpan(0, 1)), kv, strict=True):
        part.copy_(half)
    assert torch.equal(read_span(views(CacheSpan(0, 1))), kv)
    assert views.wire_layout().wire == "L2xbt4xH2xD8xfloat32"


# -- settings as vLLM's arguments ---------------------------------------------------------
def test_engine_arguments_carry_our_settings_and_refuse_ours_alone(tmp_path: Path) -> None:
    engine = EngineConfig(block_tokens=32, kv_cache_mib=64, max_model_len=1024)
    args = engine_kwargs(
        engine, VllmOptions(vllm_compile=False), tmp_path, tmp_path / "s", "ipc://e"
    )
    assert args["block_size"] == 32 and args["kv_cache_memory_bytes"] == 64 << 20
    assert args["enforce_eager"] and args["max_model_len"] == 1024
    connector = args["kv_transfer_config"]
    assert connector["kv_connector"] == "KVServeConnector"
    assert connector["kv_load_failure_policy"] == "recompute"
    assert connector["kv_connector_extra_config"] == {"kvserve_spec": str(tmp_path / "s")}
    assert args["kv_events_config"]["endpoint"] == "ipc://e"
    extra = VllmOptions(vllm_engine_args='{"gpu_memory_utilization": 0.5}')
    assert engine_kwargs(engine, extra, tmp_path, tmp_path, "e")["gpu_memory_utilization"] == 0.5
    for bad in (
        EngineConfig(attention="torch"),
        EngineConfig(kv_streaming=False),
        EngineConfig(kv_push_timing="layerwise"),
    ):
        with pytest.raises(ValueError, match="kvserve's"):
            engine_kwargs(bad, VllmOptions(), tmp_path, tmp_path, "e")
    with pytest.raises(ValueError, match="block_size"):
        engine_kwargs(
            engine, VllmOptions(vllm_engine_args='{"block_size": 16}'), tmp_path, tmp_path, "e"
        )
    with pytest.raises(ValueError, match="JSON object"):
        VllmOptions(vllm_engine_args="[1]")


def test_threads_are_bound_to_a_pinned_workers_cores_and_free_otherwise() -> None:
    assert cpu_binding({1}, 1) == {
        "VLLM_CPU_OMP_THREADS_BIND": "1",
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    }
    assert cpu_binding({0, 1}, 0)["VLLM_CPU_OMP_THREADS_BIND"] == "0,1"
    assert cpu_binding({0, 1}, 1) == {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}


def test_sampling_follows_our_fields() -> None:
    params = SamplingParams(
        max_tokens=9, temperature=0.5, top_k=0, seed=3, stop=("x",), stop_token_ids=(7,),
        logit_bias={5: 1.5}, min_tokens=4, logprobs=2,
    )  # fmt: skip
    got = sampling_kwargs(params, 8, 3, {"rid": "r"})
    assert got["max_tokens"] == 8 and got["min_tokens"] == 3 and got["top_k"] == -1
    assert got["seed"] == 3 and got["stop_token_ids"] == [7] and got["logit_bias"] == {5: 1.5}
    assert "stop" not in got and got["detokenize"] is False
    assert got["extra_args"] == {"kv_transfer_params": {"rid": "r"}}
    assert sampling_kwargs(params, 2, 3, {})["min_tokens"] == 2


# -- reservations -------------------------------------------------------------------------
def test_reservations_hold_pages_against_what_vllm_has_free() -> None:
    now = [0.0]
    book = ReservationBook(total_pages=10, block_tokens=4, clock=lambda: now[0])
    assert book.reserve("a", 10, 5, 30.0, free=6) == 3  # prompt + first token: 11 tokens
    assert book.reserve("b", 10, 5, 30.0, free=6) == 3
    assert book.reserve("c", 10, 5, 30.0, free=6) is None  # 6 free, 6 promised: not now
    with pytest.raises(ValueError, match="more than"):
        book.reserve("d", 30, 20, 30.0, free=10)
    assert book.take("a") and not book.take("a") and book.promised == 3
    now[0] = 31.0
    assert not book.holds("b") and len(book) == 0


# -- outputs ------------------------------------------------------------------------------
class Stream:
    """Each token's text is its own letter (token 0 is 'a')."""

    def step(self, token_id: int) -> str:
        return chr(ord("a") + token_id)


class Lp(NamedTuple):
    logprob: float
    rank: int | None


def test_a_call_releases_text_and_stops_as_our_engine() -> None:
    params = SamplingParams(max_tokens=10, stop=("cd",))
    out = CallOutputs("r", Stream(), params, [9, 9], earlier=[0])  # 'a' made elsewhere
    first = out.step([1, 2], None, None)  # 'c' held for a possible stop
    assert first.text_delta == "ab" and not first.finished  # 'a' was held back there too
    last = out.step([3, 4], None, None)  # 'd' completes the stop string: 'e' never taken
    assert last.finish_reason is FinishReason.STOP and last.new_token_ids == [3]
    assert last.text == "ab" and last.output_token_ids == [0, 1, 2, 3]


def test_a_prefill_capped_at_one_token_is_a_handoff_keeping_held_text() -> None:
    params = SamplingParams(max_tokens=5, stop=("bc",))
    out = CallOutputs("r", Stream(), params, [9], handoff_within=100).step([1], None, "length")
    assert out.finish_reason is FinishReason.HANDOFF and out.text_delta == "" and out.finished
    real = SamplingParams(max_tokens=1)
    end = CallOutputs("r", Stream(), real, [9], handoff_within=100).step([1], None, "length")
    assert end.finish_reason is FinishReason.LENGTH and end.text_delta == "b"
    eos = CallOutputs("r", Stream(), params, [9], handoff_within=100).step([1], None, "stop")
    assert eos.finish_reason is FinishReason.STOP


def test_logprobs_are_the_token_and_its_best_k() -> None:
    params = SamplingParams(max_tokens=3, logprobs=1)
    entry = {7: Lp(-2.0, 3), 4: Lp(-0.1, 1), 5: Lp(-0.5, 2)}
    out = CallOutputs("r", Stream(), params, [0]).step([7], [entry], None)
    assert out.logprobs == [TokenLogprob(-2.0, (4,), (-0.1,))]
    assert prompt_logprobs([1, 7], [None, entry], 2) == [TokenLogprob(-2.0, (4, 5), (-0.1, -0.5))]


# -- the connector's spec and the worker's state -----------------------------------------
def test_the_spec_round_trips_and_is_private(tmp_path: Path) -> None:
    cluster = ClusterConfig(cluster_secret="s" * 40, hash_algorithm="xxh3")
    namespace = Namespace("m@1", "float32", 32, algorithm="xxh3")
    spec = ConnectorSpec(
        PoolConfig(pool_segment_mib=16), cluster, namespace, "L1xbt32xH1xD8xfloat32", "ipc://r", "w"
    )
    path = spec.save(tmp_path / "spec.json")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert ConnectorSpec.load(path) == spec
    assert spec.hasher.root("") == PrefixHasher(namespace, cluster.keyring.prefix_root).root("")
    path.write_text(json.dumps({"pool": {}}))
    with pytest.raises(ValueError, match="spec"):
        ConnectorSpec.load(path)


def test_the_state_counts_reports_and_steps() -> None:
    state = WorkerState(total_pages=100)

    async def run() -> tuple[int, int]:
        state.open("r")
        state.handle({"k": "admit", "rid": "r", "pool": 64})
        state.handle(
            {"k": "load", "rid": "r", "tokens": 32, "bytes": 10, "seconds": 0.1, "exposed": 0.05}
        )
        state.handle({"k": "write", "rid": "gone", "bytes": 7, "seconds": 0.2, "exposed": 0.0})
        return await state.pool_tokens("r", 0.1)

    assert asyncio.run(run()) == (64, 32)
    assert state.stats.kv_read.bytes == 10 and state.stats.kv_write.bytes == 7
    state.record_step(1.0, 2, 1, 0.25, 10, 0, 0, [0.5])
    state.record_step(1.2, 2, 0, 0.3, 0, 2, 1, [])
    load = state.load(reserved=1, promised=5, idle=False)
    assert load.running == 2 and load.free_pages == 100 - 30 - 5
    idle = state.load(reserved=0, promised=0, idle=True)
    assert idle.running == 0 and idle.free_pages == 100  # no step after the last one
    assert state.stats.preemptions == 1 and state.stats.decode_step_tokens == 2
    pool: dict[str, Any] = {
        "connected": True,
        "outages": 2,
        "forged_blocks": 1,
        "checksum_failures": 0,
        "healed_blocks": 0,
        "eviction": {
            "evicted_blocks": 0,
            "refused_blocks": 0,
            "orphans_removed": 0,
            "index_errors": 0,
        },
        "tiers": {
            "dram_objects": 0,
            "ssd_objects": 0,
            "dram_read_seconds": 0.0,
            "ssd_read_seconds": 0.0,
        },
    }
    state.handle({"k": "pool", "health": pool})
    assert state.pool.outages == 2 and state.pool.forged_blocks == 1


def test_the_pool_counts_as_joined_only_when_every_worker_side_joined() -> None:
    async def run(*oks: bool) -> bool:
        state = WorkerState(total_pages=1)
        for ok in oks:
            state.handle({"k": "joined", "ok": ok})
        return await state.joined(0.01)

    assert asyncio.run(run(True)) is True
    assert asyncio.run(run(True, False, True)) is False
    assert asyncio.run(run()) is False  # never reported: not joined

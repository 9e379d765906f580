"""Bounded work in the router, without HTTP: the settings and the uvicorn config built from
them, the tokenizing threads' bound, and pool lookups against a master that never answers.

:class:`FrozenStore` is that master's stand-in (also used by
``tests/integration/test_router_bounded.py``): ``exists`` blocks until :meth:`thaw`.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import threading
import time
from typing import cast

import pytest
from uvicorn.protocols.http.h11_impl import H11Protocol

from kvpool.config import PoolConfig
from kvpool.hashing import Namespace
from kvpool.store import MooncakeStore
from kvserve.settings import add_config_args, config_from_args
from proto.registry import ClusterConfig, WorkerRecord
from router.config import RouterConfig
from router.flow.tokenizer import TOKENIZE_THREADS, TokenizerSlot
from router.main import server_config
from router.placement.pool_lookup import LOOKUP_THREADS, PoolLookup

NAMESPACE = Namespace(model="m@0", dtype="float32", block_tokens=4)
RECORD = WorkerRecord(
    worker_id="w", address="127.0.0.1:1", role="decode", model="m", model_dir="/nowhere",
    contract=f"{NAMESPACE.key}|L2", block_tokens=4, num_layers=2,
    max_model_len=4096, started_at=0.0, heartbeat_at=0.0,
)  # fmt: skip
PROMPT = list(range(16))  # 4 blocks of RECORD's 4 tokens


class FrozenStore:
    """A pool client whose master never answers until :meth:`thaw`; then every key exists."""

    def __init__(self) -> None:
        self._thawed = threading.Event()
        self.calls = 0

    def exists(self, keys: list[str]) -> list[int]:
        self.calls += 1
        self._thawed.wait(30)
        return [1] * len(keys)

    def thaw(self) -> None:
        self._thawed.set()

    def close(self) -> None:
        pass

    def as_store(self) -> MooncakeStore:
        return cast(MooncakeStore, self)


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"max_connections": 1}, "max_connections"),
        ({"header_timeout_s": 0.0}, "header_timeout_s"),
        ({"header_timeout_s": float("nan")}, "header_timeout_s"),
        ({"keep_alive_timeout_s": 0}, "keep_alive_timeout_s"),
        ({"pool_lookup_timeout_s": -1.0}, "pool_lookup_timeout_s"),
    ],
)
def test_rejects_bad_bounds(fields: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        RouterConfig(**fields)  # type: ignore[arg-type]


def test_bounds_from_flags_and_environment_reach_uvicorn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVSERVE_MAX_CONNECTIONS", "64")
    monkeypatch.setenv("KVSERVE_POOL_LOOKUP_TIMEOUT_S", "0.25")
    parser = argparse.ArgumentParser()
    add_config_args(parser, RouterConfig)
    ns = parser.parse_args(["--header-timeout-s", "3.5", "--keep-alive-timeout-s", "7"])
    router = config_from_args(RouterConfig, ns)
    assert (router.max_connections, router.header_timeout_s) == (64, 3.5)
    assert (router.keep_alive_timeout_s, router.pool_lookup_timeout_s) == (7, 0.25)
    config = server_config(None, router, port=1234)
    assert (config.limit_concurrency, config.timeout_keep_alive, config.port) == (64, 7, 1234)
    assert isinstance(config.http, type) and issubclass(config.http, H11Protocol)
    assert vars(config.http)["head_timeout_s"] == 3.5


def test_tokenizing_runs_in_at_most_its_threads() -> None:
    running, most = 0, 0
    lock, release = threading.Lock(), threading.Event()

    def work(n: int) -> int:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        release.wait(10)
        with lock:
            running -= 1
        return n

    async def main() -> list[int]:
        slot = TokenizerSlot()
        calls = asyncio.gather(*(slot.off_loop(work, n) for n in range(3 * TOKENIZE_THREADS)))
        while most < TOKENIZE_THREADS:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # room for any thread beyond the bound to start
        assert most == TOKENIZE_THREADS
        release.set()
        return await calls

    assert asyncio.run(main()) == list(range(3 * TOKENIZE_THREADS))


def _lookup_threads() -> int:
    return sum(t.name == "pool-lookup" for t in threading.enumerate())


def test_a_frozen_master_costs_no_hits_bounded_threads_and_one_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    frozen = FrozenStore()
    lookup = PoolLookup(PoolConfig(), ClusterConfig(), enabled=False, timeout_s=0.2)
    lookup._store = frozen.as_store()

    async def main() -> None:
        first = asyncio.create_task(lookup.pooled_tokens(PROMPT, RECORD))
        assert await asyncio.wait_for(first, 10) == 0  # timed out: no hit
        rest = [lookup.pooled_tokens(PROMPT, RECORD) for _ in range(2 * LOOKUP_THREADS)]
        assert await asyncio.wait_for(asyncio.gather(*rest), 10) == [0] * len(rest)
        assert lookup.timeouts == 1 + len(rest)
        assert frozen.calls == _lookup_threads() == LOOKUP_THREADS  # the rest were skipped
        frozen.thaw()
        deadline = time.monotonic() + 10
        while _lookup_threads() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert await lookup.pooled_tokens(PROMPT, RECORD) == len(PROMPT)  # threads came back

    with caplog.at_level(logging.WARNING, logger="router.placement.pool_lookup"):
        asyncio.run(main())
    assert len(caplog.records) == 1 and "no answer within 0.2 s" in caplog.text

"""KV pages device -> pool -> device across two processes, bit-exact (see
:mod:`kvserve.gpucheck`).

:class:`RoundTrips` starts a ``mooncake_master`` on free loopback ports and two member
processes (``python -m kvserve.gpucheck.roundtrip``) once for every round trip of a run.
For each staging mode asked (:meth:`RoundTrips.run`), the writer fills the pages of a KV
cache of its own on the device with random values and publishes them (``KVPool.save``);
once it has, the reader, with a cache of its own, loads them into other pages
(``KVPool.load``). Each joins the pool anew for the mode (a namespace per mode: its keys
are new to the pool) and prints one JSON line with a SHA-256 of every page's bytes (or the
error that stopped it); the check compares them. A member stays a pool member, holding what
it wrote, until told it is done.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import select
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from kvpool.config import PoolConfig
from kvpool.hashing import Namespace, PrefixHasher
from kvpool.master import MasterConfig
from kvpool.net import free_local_ports
from kvpool.pool import KVPool
from kvserve.cluster.pool import MasterProcess
from kvserve.gpucheck.exactness import CheckFailedError
from workers.core.kv_cache import KVCache
from workers.handoff.pool_transfer import join_pool
from workers.model.config import ModelConfig

SHAPE = ModelConfig(
    model_type="llama", tie_word_embeddings=False, vocab_size=256, hidden_size=256,
    intermediate_size=512, num_layers=4, num_heads=8, num_kv_heads=2, head_dim=32,
    rms_norm_eps=1e-5, max_position_embeddings=4096,
)  # fmt: skip
"""The KV shape moved (only its KV dimensions matter: no model runs)."""
BLOCKS, BLOCK_TOKENS, PAGES = 24, 16, 64
MEMBER_TIMEOUT_S = 120.0


def _pages_digest(kv: KVCache, pages: list[int]) -> list[str]:
    return [
        hashlib.sha256(
            kv.slab[:, page].contiguous().cpu().view(torch.uint8).numpy().tobytes()
        ).hexdigest()
        for page in pages
    ]


def member(
    role: str, master: str, metadata: str, device: str, staging: str
) -> tuple[dict[str, Any], KVPool]:
    """One side of the round trip (``role`` ``writer`` or ``reader``): what it prints, and
    its pool (the objects it wrote live as long as its store is open)."""
    dtype = "bfloat16" if device.startswith("cuda") else "float32"
    kv = KVCache(SHAPE, PAGES, BLOCK_TOKENS, getattr(torch, dtype), torch.device(device))
    config = PoolConfig(
        pool_master=master, pool_metadata_server=metadata, pool_segment_mib=64,
        pool_local_buffer_mib=16, kv_staging=staging,
    )  # fmt: skip
    namespace = Namespace(f"gpucheck-{staging}@0", dtype, BLOCK_TOKENS)
    pool = join_pool(config, namespace, kv, dtype)
    if pool is None:
        raise RuntimeError("could not join the pool (see the log above)")
    hashes = PrefixHasher(namespace).chain(list(range(BLOCKS * BLOCK_TOKENS)), BLOCK_TOKENS)
    if role == "writer":
        generator = torch.Generator(device=device).manual_seed(7)
        kv.slab.copy_(torch.randn(kv.slab.shape, generator=generator, device=device))
        pages = list(range(BLOCKS))
        count = pool.save(hashes, pages)
    else:
        pages = list(range(PAGES - BLOCKS, PAGES))  # other pages than the writer's
        count = pool.load(hashes, pages)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    stats = {k: v for k, v in vars(pool.stats).items() if isinstance(v, int) and v}
    answer = {
        "role": role, "blocks": count, "staged": pool.staged, "stats": stats,
        "pages": _pages_digest(kv, pages),
    }  # fmt: skip
    return answer, pool


class MemberError(RuntimeError):
    """A member answered that its side of a round trip failed (the conversation with it
    stays in step: the next mode can be asked)."""


def _start(role: str, cfg: MasterConfig, device: str) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", __name__, role, cfg.rpc_address, cfg.metadata_url, device]
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _answer(proc: subprocess.Popen[str], role: str) -> dict[str, Any]:
    """The member's JSON line, within :data:`MEMBER_TIMEOUT_S` (a member stuck joining the
    pool must not hold up the other checks)."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], MEMBER_TIMEOUT_S)
    if not ready:
        raise TimeoutError(f"the {role} process gave no answer in {MEMBER_TIMEOUT_S:.0f} s")
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"the {role} process ended without an answer (rc {proc.wait(10)})")
    return json.loads(line)  # type: ignore[no-any-return]


def _finish(proc: subprocess.Popen[str]) -> None:
    """Tell a member to go; kill it if it does not in :data:`MEMBER_TIMEOUT_S`."""
    try:
        proc.communicate("done\n", timeout=MEMBER_TIMEOUT_S)
    except (subprocess.TimeoutExpired, OSError, ValueError):
        proc.kill()
        proc.wait()


class RoundTrips:
    """The master and the two members of a run's round trips (module docstring).

    Lifecycle: the processes start on the first :meth:`run` (its errors are that check's);
    each :meth:`run` asks both members for one mode; :meth:`close` tells the reader, then
    the writer (which holds the objects), to go, and stops the master. A round trip that
    broke (no answer in time, a member gone) leaves the members' conversation unknown, so
    every later :meth:`run` fails at once, saying so; a member that answered with its
    error (:class:`MemberError`) is still in step."""

    def __init__(self, device: str) -> None:
        self.device = device
        self._stack = contextlib.ExitStack()
        self._members: dict[str, subprocess.Popen[str]] = {}
        self._broken = ""

    def _start_once(self) -> None:
        if not self._members:
            rpc, meta, metrics = free_local_ports(3)
            cfg = MasterConfig(
                master_port=rpc, master_metadata_port=meta, master_metrics_port=metrics
            )
            tmp = self._stack.enter_context(tempfile.TemporaryDirectory())
            self._stack.enter_context(MasterProcess(cfg, Path(tmp) / "master.log"))
            for role in ("writer", "reader"):  # stopped in the reverse order: reader first
                self._members[role] = _start(role, cfg, self.device)
                self._stack.callback(_finish, self._members[role])

    def _ask(self, role: str, staging: str) -> dict[str, Any]:
        proc = self._members[role]
        assert proc.stdin is not None
        proc.stdin.write(staging + "\n")
        proc.stdin.flush()
        answer = _answer(proc, role)
        if "error" in answer:
            raise MemberError(f"the {role} failed: {answer['error']}")
        return answer

    def run(self, staging: str) -> dict[str, Any]:
        """The round trip with ``--kv-staging staging``; its figures, or
        :class:`CheckFailedError`."""
        if self._broken:
            raise RuntimeError(f"the members broke in an earlier round trip: {self._broken}")
        try:
            self._start_once()
            wrote, read = self._ask("writer", staging), self._ask("reader", staging)
        except MemberError:
            raise
        except Exception as exc:  # out of step with the members (or they never started)
            self._broken = str(exc)
            raise
        figures = {
            "kv_staging": staging,
            "staged": wrote["staged"],
            "blocks_written": wrote["blocks"],
            "blocks_read": read["blocks"],
            "pages_equal": sum(a == b for a, b in zip(wrote["pages"], read["pages"], strict=True)),
            "pages": BLOCKS,
            "reader_stats": read["stats"],
        }
        if read["blocks"] != BLOCKS or figures["pages_equal"] != BLOCKS:
            raise CheckFailedError("the pages read back differ from the pages written", figures)
        return figures

    def close(self) -> None:
        self._stack.close()


def main(argv: list[str]) -> int:
    """A member (``role master metadata device``): for each staging mode read from stdin,
    one JSON line (the round trip's side, or ``{"error": ...}``), until ``done``."""
    role, master, metadata, device = argv
    pools: list[KVPool] = []
    try:
        for line in sys.stdin:
            staging = line.strip()
            if staging in ("", "done"):
                break
            try:
                answer, pool = member(role, master, metadata, device, staging)
                pools.append(pool)
            except Exception as exc:  # this mode's failure, told to the check
                answer = {"error": f"{type(exc).__name__}: {exc}"}
            print(json.dumps(answer), flush=True)
    finally:
        for pool in pools:
            pool.close()
            pool.store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

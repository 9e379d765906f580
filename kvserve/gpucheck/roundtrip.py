"""KV pages device -> pool -> device across two processes, bit-exact (see
:mod:`kvserve.gpucheck`).

:func:`pool_roundtrip` starts a ``mooncake_master`` on free loopback ports and two member
processes (``python -m kvserve.gpucheck.roundtrip``): the writer fills the pages of a KV
cache on the device with random values and publishes them (``KVPool.save``); once it has,
the reader, with a cache of its own, loads them into other pages (``KVPool.load``). Each
prints one JSON line with a SHA-256 of every page's bytes; the check compares them. The
writer stays until the reader is done (its segment holds the objects).
"""

from __future__ import annotations

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
    namespace = Namespace(model="gpucheck@0", dtype=dtype, block_tokens=BLOCK_TOKENS)
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


def _start(role: str, cfg: MasterConfig, device: str, staging: str) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", __name__, role, cfg.rpc_address, cfg.metadata_url, device]
    return subprocess.Popen(
        [*argv, staging], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )


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
    except (subprocess.TimeoutExpired, OSError):
        proc.kill()
        proc.wait()


def pool_roundtrip(device: str, staging: str) -> dict[str, Any]:
    """The round trip with ``--kv-staging staging``; its figures, or :class:`CheckFailedError`."""
    rpc, meta, metrics = free_local_ports(3)
    cfg = MasterConfig(master_port=rpc, master_metadata_port=meta, master_metrics_port=metrics)
    members: list[subprocess.Popen[str]] = []
    with tempfile.TemporaryDirectory() as tmp, MasterProcess(cfg, Path(tmp) / "master.log"):
        try:
            members.append(_start("writer", cfg, device, staging))
            wrote = _answer(members[0], "writer")
            members.append(_start("reader", cfg, device, staging))
            read = _answer(members[1], "reader")
        finally:
            for proc in reversed(members):  # the reader first: the writer holds the objects
                _finish(proc)
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


def main(argv: list[str]) -> int:
    answer, pool = member(*argv)
    print(json.dumps(answer), flush=True)
    sys.stdin.readline()  # stay a pool member until told to go
    pool.close()
    pool.store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

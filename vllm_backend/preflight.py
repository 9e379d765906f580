"""What ``kvserve worker --engine vllm`` checks before it imports vLLM: importing
:mod:`vllm_backend.server` (vLLM, its engine and its libraries) takes about 10 s of CPU and
loading the model a minute more, so a worker that cannot serve says so first, in about a
second, and exits 1 having registered nothing.

The checks, in order, each refusal logged:

1. the pool is on (``--use-pool``): a vLLM-backed worker serves through it;
2. :func:`workers.serve.serving.admitted`: Redis takes this worker's credentials and its TLS
   settings can serve;
3. for a prefill or decode worker (:func:`needs_pool`), :func:`kvpool.store.check_master`:
   the pool's master answers.

Nothing here imports vLLM: the module runs (and is tested) in the project's environment too.
"""

from __future__ import annotations

import logging

from kvpool.config import PoolConfig
from kvpool.store import PoolUnavailableError, check_master
from proto.registry import ClusterConfig
from workers.config import WorkerConfig
from workers.serve.serving import admitted

log = logging.getLogger(__name__)
NO_POOL = "the %s role needs the KV pool, which vLLM could not join"
"""What a prefill or decode worker logs, with its role, when it exits without the pool."""


def needs_pool(worker: WorkerConfig) -> bool:
    """A prefill or decode worker serves through the pool; a mixed one can serve from
    vLLM's own cache alone."""
    return worker.role != "mixed"


def may_start(worker: WorkerConfig, pool: PoolConfig, cluster: ClusterConfig) -> bool:
    """Whether the worker passes checks 1-3 (each failure logged): False means exit 1."""
    if not worker.use_pool:
        log.error("--engine vllm serves through the KV pool: keep --use-pool")
        return False
    if not admitted(cluster):
        return False
    if needs_pool(worker):
        try:
            check_master(pool)
        except PoolUnavailableError as exc:
            log.error(f"{NO_POOL}: %s", worker.role, exc)
            return False
    return True

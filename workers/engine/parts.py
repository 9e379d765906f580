"""Building an engine's parts from its config: model, KV cache, prefix hasher, pool.

:func:`load_parts` is the first step of ``Engine(config, pool, keyring)`` (see
:mod:`workers.engine.engine`): it loads the model directory, sizes the KV cache from
``kv_cache_mib`` (or ``num_kv_blocks``), builds the KV namespace (model fingerprint, dtype,
block size, hash algorithm and version) and the prefix hasher keyed from the cluster
secret, and, when a pool is configured, joins it with the keyring's block key (a pool that
cannot be reached is logged and skipped: ``pool`` is then ``None``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from kvpool.chain_index import ChainIndex
from kvpool.config import PoolConfig
from kvpool.hashing import Namespace, PrefixHasher
from kvpool.keyring import Keyring
from kvpool.pool import KVPool
from proto.tokenization import Tokenizer
from workers.config import EngineConfig
from workers.core.kv_cache import KVCache, blocks_for_memory
from workers.core.scheduler import SchedulerConfig
from workers.engine.model_runner import ModelRunner
from workers.handoff.pool_transfer import join_pool
from workers.model import native
from workers.model.config import ModelConfig
from workers.model.loader import load_model, model_fingerprint
from workers.model.prepare import resolve_model_dir
from workers.model.rope import RotaryTable


def use_native(config: EngineConfig) -> bool:
    """Whether attention runs on the C++ kernels (see ``EngineConfig.attention``)."""
    if config.attention == "torch" or config.device != "cpu":
        return False
    if native.available():
        return True
    if config.attention == "native":
        raise RuntimeError(f"native attention kernels unavailable: {native.unavailable_reason()}")
    return False


@dataclass(frozen=True)
class EngineParts:
    """What :func:`load_parts` built; the engine takes each part over."""

    model_dir: Path
    dtype: torch.dtype
    device: torch.device
    model_config: ModelConfig
    namespace: Namespace
    hasher: PrefixHasher
    max_model_len: int
    num_blocks: int
    tokenizer: Tokenizer
    eos_token_ids: frozenset[int]
    runner: ModelRunner
    pool: KVPool | None

    def scheduler_config(self, config: EngineConfig) -> SchedulerConfig:
        return SchedulerConfig(
            num_blocks=self.num_blocks,
            block_tokens=config.block_tokens,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_model_len=self.max_model_len,
            prefix_caching=config.prefix_caching,
        )


def load_parts(
    config: EngineConfig,
    pool: PoolConfig | None,
    keyring: Keyring,
    index: ChainIndex | None = None,
) -> EngineParts:
    """Load and size everything ``config`` names (see the module docstring); ``index`` is
    the pool's chain index (chain-aware eviction), if the cluster has one."""
    if config.threads:
        torch.set_num_threads(config.threads)
    model_dir = resolve_model_dir(config.model)
    dtype = getattr(torch, config.dtype)
    device = torch.device(config.device)
    model, cfg = load_model(model_dir, dtype, device)
    namespace = Namespace(
        model=f"{model_dir.name}@{model_fingerprint(model_dir)}",
        dtype=config.dtype,
        block_tokens=config.block_tokens,
        algorithm=keyring.algorithm,
    )
    max_model_len = min(
        config.max_model_len or cfg.max_position_embeddings, cfg.max_position_embeddings
    )
    num_blocks = config.num_kv_blocks or blocks_for_memory(
        cfg, config.block_tokens, dtype, config.kv_cache_mib << 20
    )
    kv = KVCache(cfg, num_blocks, config.block_tokens, dtype, device)
    rope = RotaryTable(cfg.rope, cfg.head_dim, max_model_len, dtype, device)
    tokenizer = Tokenizer(model_dir, lazy=True)
    eos = set(cfg.eos_token_ids)
    if tokenizer.eos_token_id is not None:
        eos.add(tokenizer.eos_token_id)
    runner = ModelRunner(model, kv, rope, native=use_native(config), eos_token_ids=frozenset(eos))
    block_key = keyring.pool_block
    joined = join_pool(pool, namespace, kv, config.dtype, block_key, index) if pool else None
    return EngineParts(
        model_dir=model_dir,
        dtype=dtype,
        device=device,
        model_config=cfg,
        namespace=namespace,
        hasher=PrefixHasher(namespace, keyring.prefix_root),
        max_model_len=max_model_len,
        num_blocks=num_blocks,
        tokenizer=tokenizer,
        eos_token_ids=frozenset(eos),
        runner=runner,
        pool=joined,
    )

"""One model engine: continuous batching over a paged KV cache, in-process.

Lifecycle:

1. ``Engine(config, pool)`` loads the model directory, sizes the KV cache from
   ``kv_cache_mib``, builds the KV namespace (model fingerprint, dtype, block size, hash
   version) and, when a pool is given, joins it (a pool that cannot be reached is logged
   and skipped: the pool is a cache, never a condition of correctness);
2. :meth:`Engine.add_request` validates and queues a request (``ValueError`` if it can never
   fit); :meth:`Engine.abort` ends one at any point and frees its pages;
3. :meth:`Engine.step` schedules one batch (admission pulls further prefix blocks from the
   pool), runs the model, publishes newly full blocks to the pool, appends sampled tokens,
   ends requests that hit EOS, a stop token or string, or ``max_tokens``, and returns what
   changed;
4. :meth:`Engine.generate` drives steps until given requests finish (offline use, tests).

The serving roles of later components wrap this same engine.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from kvpool.config import PoolConfig
from kvpool.hashing import Namespace
from kvpool.layout import KVLayout
from kvpool.pool import KVPool
from kvpool.store import MooncakeStore, PoolUnavailableError
from workers.config import EngineConfig
from workers.kv_cache import KVCache, blocks_for_memory
from workers.model.loader import load_model, model_fingerprint
from workers.model.prepare import default_model_dir
from workers.model.rope import RotaryTable
from workers.model_runner import ModelRunner
from workers.scheduler import Scheduler, SchedulerConfig
from workers.sequence import FinishReason, SamplingParams, Sequence
from workers.tokenizer import Tokenizer


@dataclass
class RequestOutput:
    """What one step (or a whole run) produced for one request."""

    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    new_token_ids: list[int]
    finished: bool
    finish_reason: FinishReason | None = None
    num_cached_tokens: int = 0
    num_pool_tokens: int = 0
    text: str | None = None


@dataclass
class EngineStats:
    """Cumulative counters since start."""

    steps: int = 0
    prompt_tokens_computed: int = 0
    prompt_tokens_cached: int = 0
    prompt_tokens_from_pool: int = 0
    output_tokens: int = 0
    preemptions: int = 0
    busy_seconds: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)


def resolve_model_dir(model: str) -> Path:
    """The directory for ``--model`` (empty: the default model), or a clear error."""
    path = Path(model).expanduser() if model else default_model_dir()
    if not (path / "config.json").is_file():
        hint = "run `kvserve prepare-model`" if not model else "point --model at a HF directory"
        raise FileNotFoundError(f"no model at {path} ({hint})")
    return path


log = logging.getLogger(__name__)


def join_pool(config: PoolConfig, namespace: Namespace, kv: KVCache, dtype: str) -> KVPool | None:
    """Connect ``kv``'s slab to the shared pool, or ``None`` (logged) if it cannot be."""
    if kv.slab.device.type != "cpu":
        log.warning("the KV pool needs a host-memory KV cache for now; running without it")
        return None
    try:
        store = MooncakeStore.connect(config)
    except PoolUnavailableError as exc:
        log.warning("running without the KV pool: %s", exc)
        return None
    shape = kv.slab.shape
    layout = KVLayout(
        num_layers=shape[0],
        num_blocks=shape[1],
        block_tokens=shape[3],
        kv_heads=shape[4],
        head_dim=shape[5],
        dtype=dtype,
    )
    writer = f"{socket.gethostname()}-{os.getpid()}-{id(kv):x}"
    return KVPool(store, namespace, layout, kv.slab.data_ptr(), writer)


class Engine:
    def __init__(self, config: EngineConfig, pool: PoolConfig | None = None) -> None:
        self.config = config
        if config.threads:
            torch.set_num_threads(config.threads)
        self.model_dir = resolve_model_dir(config.model)
        self.dtype = getattr(torch, config.dtype)
        self.device = torch.device(config.device)
        model, self.model_config = load_model(self.model_dir, self.dtype, self.device)
        cfg = self.model_config
        self.namespace = Namespace(
            model=f"{self.model_dir.name}@{model_fingerprint(self.model_dir)}",
            dtype=config.dtype,
            block_tokens=config.block_tokens,
        )
        self.max_model_len = min(
            config.max_model_len or cfg.max_position_embeddings, cfg.max_position_embeddings
        )
        num_blocks = config.num_kv_blocks or blocks_for_memory(
            cfg, config.block_tokens, self.dtype, config.kv_cache_mib << 20
        )
        kv = KVCache(cfg, num_blocks, config.block_tokens, self.dtype, self.device)
        rope = RotaryTable(cfg.rope, cfg.head_dim, self.max_model_len, self.dtype, self.device)
        self.runner = ModelRunner(model, kv, rope)
        self.pool = join_pool(pool, self.namespace, kv, config.dtype) if pool else None
        self.scheduler = Scheduler(
            SchedulerConfig(
                num_blocks=num_blocks,
                block_tokens=config.block_tokens,
                max_num_seqs=config.max_num_seqs,
                max_num_batched_tokens=config.max_num_batched_tokens,
                max_model_len=self.max_model_len,
                prefix_caching=config.prefix_caching,
            ),
            self.namespace.seed,
            remote=self.pool,
        )
        self.tokenizer = Tokenizer(self.model_dir)
        eos = set(cfg.eos_token_ids)
        if self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        self.eos_token_ids = frozenset(eos)
        self.stats = EngineStats()
        self._requests: dict[str, Sequence] = {}
        self._ids = itertools.count()

    # -- requests --------------------------------------------------------------------------
    def add_request(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        request_id: str | None = None,
    ) -> str:
        """Queue a request; ``ValueError`` if it is invalid or can never fit."""
        request_id = request_id or f"req-{next(self._ids)}"
        if request_id in self._requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        vocab = self.model_config.vocab_size
        if any(not 0 <= t < vocab for t in prompt_token_ids):
            raise ValueError(f"prompt token ids must be in [0, {vocab})")
        seq = Sequence(request_id, list(prompt_token_ids), params, arrival_step=self.stats.steps)
        self.scheduler.add(seq)
        self._requests[request_id] = seq
        return request_id

    def abort(self, request_id: str) -> bool:
        """End a request wherever it is; False if it is unknown or already finished."""
        seq = self._requests.pop(request_id, None)
        if seq is None:
            return False
        self.scheduler.finish(seq, FinishReason.ABORT)
        self.runner.forget(request_id)
        return True

    @property
    def has_unfinished(self) -> bool:
        return self.scheduler.has_work

    @property
    def num_free_blocks(self) -> int:
        return self.scheduler.blocks.pool.num_free

    # -- one step --------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one batch; returns an output for every request that got a token or ended."""
        batch = self.scheduler.schedule()
        if not batch:
            return []
        t0 = time.perf_counter()
        for seq, n in batch.entries:
            if seq.num_computed_tokens < seq.num_prompt_tokens:
                self.stats.prompt_tokens_computed += min(
                    n, seq.num_prompt_tokens - seq.num_computed_tokens
                )
        sampled, tokens = self.runner.execute(batch)
        self.scheduler.update(batch)
        if self.pool is not None and batch.committed:
            self.pool.save([h for h, _ in batch.committed], [p for _, p in batch.committed])
        outputs = [self._append(seq, tok) for seq, tok in zip(sampled, tokens, strict=True)]
        self.stats.steps += 1
        self.stats.output_tokens += len(tokens)
        self.stats.preemptions = self.scheduler.num_preemptions
        self.stats.busy_seconds += time.perf_counter() - t0
        return outputs

    def _append(self, seq: Sequence, token: int) -> RequestOutput:
        if seq.num_output_tokens == 0:
            self.stats.prompt_tokens_cached += seq.num_cached_tokens
            self.stats.prompt_tokens_from_pool += seq.num_pool_hit_tokens
        seq.token_ids.append(token)
        reason, text = self._finish_reason(seq, token)
        if reason is not None:
            self.scheduler.finish(seq, reason)
            self._requests.pop(seq.request_id, None)
            self.runner.forget(seq.request_id)
            if text is None:
                text = self.tokenizer.decode(seq.output_token_ids)
        return RequestOutput(
            request_id=seq.request_id,
            prompt_token_ids=seq.token_ids[: seq.num_prompt_tokens],
            output_token_ids=seq.output_token_ids,
            new_token_ids=[token],
            finished=reason is not None,
            finish_reason=reason,
            num_cached_tokens=seq.num_cached_tokens,
            num_pool_tokens=seq.num_pool_hit_tokens,
            text=text,
        )

    def _finish_reason(self, seq: Sequence, token: int) -> tuple[FinishReason | None, str | None]:
        p = seq.params
        if token in p.stop_token_ids or (not p.ignore_eos and token in self.eos_token_ids):
            return FinishReason.STOP, None
        if p.stop:
            text = self.tokenizer.decode(seq.output_token_ids)
            hits = [i for i in (text.find(s) for s in p.stop) if i >= 0]
            if hits:
                return FinishReason.STOP, text[: min(hits)]
        if seq.num_output_tokens >= p.max_tokens or seq.num_tokens >= self.max_model_len:
            return FinishReason.LENGTH, None
        return None, None

    def close(self) -> None:
        """Leave the pool (if joined). The engine is not usable afterwards."""
        if self.pool is not None:
            self.pool.close()
            self.pool.store.close()
            self.pool = None
            self.scheduler.remote = None

    # -- offline driver --------------------------------------------------------------------
    def generate(
        self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]
    ) -> list[RequestOutput]:
        """Run ``prompts`` to completion together; outputs in prompt order."""
        plist = params if isinstance(params, list) else [params] * len(prompts)
        ids = [self.add_request(p, sp) for p, sp in zip(prompts, plist, strict=True)]
        done: dict[str, RequestOutput] = {}
        while len(done) < len(ids):
            for out in self.step():
                if out.finished:
                    done[out.request_id] = out
        return [done[i] for i in ids]

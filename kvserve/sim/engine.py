"""One simulated worker: the workers' real scheduler and block accounting, in simulated time.

Lifecycle of a :class:`SimEngine` (driven by :class:`kvserve.sim.cluster.SimCluster`):

1. requests enter as a worker's do: :meth:`SimEngine.submit` queues one (prefilled here;
   ``handoff=True`` on a prefill worker ends it after its first token, its prompt's KV left
   in the pool), :meth:`SimEngine.reserve` holds pages for a prompt prefilled elsewhere
   (:meth:`workers.core.scheduler.Scheduler.reserve`, the decode worker's own call) and
   :meth:`SimEngine.adopt` takes it over with its first token once its KV has landed;
2. when it is idle and has work, the cluster calls :meth:`SimEngine.start_step`:
   :meth:`workers.core.scheduler.Scheduler.schedule` builds the batch exactly as the engine's step
   does (admission pulls pooled prefix blocks through :class:`PoolClient`), and the step
   lasts the cost model's time for its :class:`~kvserve.sim.costs.StepShape`, plus the pool
   reads of its admissions and the part of its pool writes that streaming does not hide;
3. :meth:`SimEngine.end_step` applies it: ``Scheduler.update``, a token for each sequence
   whose step reached its end, finishes (length, or hand-off) that give pages back, and the
   blocks that became full enter the pool. It returns the tokens, for the cluster to route.
"""

from __future__ import annotations

import zlib
from collections import abc
from dataclasses import dataclass, field

from kvpool.hashing import Namespace, PrefixHasher
from kvserve.sim.costs import StepCost, StepShape
from kvserve.sim.link import Link, exposed_transfer_s
from kvserve.sim.lru import LRUCache, leading
from router.placement.policies import WorkerLoad
from workers.core.scheduler import ScheduledBatch, Scheduler, SchedulerConfig
from workers.core.sequence import FinishReason, Sequence

SIM_HASHER = PrefixHasher(
    Namespace(model="kvserve-sim", dtype="none", block_tokens=1),
    root_key=b"kvserve simulation (public)",
)
"""What names the blocks of simulated workers: a fixed, public key (a simulation protects
nothing; the chain's cost per block is the real one)."""

FIRST_OUTPUT_TOKEN = 100
OUTPUT_TOKENS = 40_000


def shape_of(batch: ScheduledBatch) -> StepShape:
    """The cost-relevant shape of a scheduled batch, before it runs."""
    prefill, decode = batch.shape()
    return StepShape(prefill=prefill, decode=decode)


def sampled_in(batch: ScheduledBatch) -> list[Sequence]:
    """Sequences whose step reaches their last token, before it runs: they get a token."""
    return [s for s, n in batch.entries if s.num_computed_tokens + n == s.num_tokens]


@dataclass(frozen=True)
class KVCosts:
    """How long KV takes to move between a worker and the pool.

    ``bytes_per_token``: all layers of one token; ``streaming``: layer-wise writes (and
    landings) that overlap the compute that produces them."""

    bytes_per_token: float
    layers: int
    link: Link
    streaming: bool = True

    def read_s(self, tokens: int) -> float:
        """A blocking read of ``tokens`` tokens' KV (admission's pull of a pooled prefix)."""
        return self.link.transfer_s(tokens * self.bytes_per_token) if tokens else 0.0

    def exposed_s(self, compute_s: float, tokens: int) -> float:
        """The part of moving ``tokens`` tokens' KV, produced by ``compute_s`` of compute,
        that the compute does not hide."""
        if not tokens:
            return 0.0
        nbytes = tokens * self.bytes_per_token
        return exposed_transfer_s(compute_s, nbytes, self.layers, self.link, self.streaming)

    def landing_s(self, step_s: float, step_tokens: int, prompt_tokens: int) -> float:
        """How long after a prefill's last step its prompt's KV has landed on the decode
        worker: streamed, the landing followed the writes and only the tail of that step's
        remains; else the whole prompt is read after the prefill."""
        if self.streaming:
            return self.exposed_s(step_s, step_tokens)
        return self.read_s(prompt_tokens)


class SimPool:
    """The shared pool as a set of block hashes: unbounded, or an LRU of ``capacity``."""

    def __init__(self, capacity_blocks: int | None = None) -> None:
        self._lru = LRUCache(capacity_blocks) if capacity_blocks else None
        self._all: set[int] = set()

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in (self._lru if self._lru is not None else self._all)

    def leading(self, hashes: list[int]) -> int:
        """How many leading hashes the pool holds."""
        return leading(hashes, self.__contains__)

    def add(self, hashes: list[int]) -> None:
        if self._lru is not None:
            self._lru.touch(hashes)
        else:
            self._all.update(hashes)


class PoolClient:
    """One engine's :class:`workers.core.block_manager.RemotePrefix` on a :class:`SimPool`;
    counts the blocks it loaded so the engine can charge their read time."""

    def __init__(self, pool: SimPool) -> None:
        self.pool = pool
        self.loaded_blocks = 0

    def lookup(self, hashes: list[int]) -> int:
        return self.pool.leading(hashes)

    def load(self, hashes: list[int], pages: list[int], prefix: abc.Sequence[int] = ()) -> int:
        n = min(self.pool.leading(hashes), len(pages))
        self.pool.add(hashes[:n])
        self.loaded_blocks += n
        return n


@dataclass
class EngineStats:
    steps: int = 0
    busy_s: float = 0.0
    prefill_s: float = 0.0
    prompt_tokens_computed: int = 0
    output_tokens: int = 0
    pool_tokens_read: int = 0


@dataclass
class _Step:
    batch: ScheduledBatch
    sampled: list[Sequence]
    seconds: float
    prompt_tokens: int


@dataclass
class SimEngine:
    """A worker of ``role`` (``prefill``, ``decode`` or ``mixed``) in the simulation."""

    worker_id: str
    role: str
    config: SchedulerConfig
    cost: StepCost
    kv: KVCosts
    pool: SimPool | None = None
    max_model_len: int = 1 << 30
    draining: bool = False
    stats: EngineStats = field(default_factory=EngineStats)
    hasher: PrefixHasher = SIM_HASHER

    def __post_init__(self) -> None:
        self.client = PoolClient(self.pool) if self.pool is not None else None
        self.scheduler = Scheduler(self.config, self.hasher, remote=self.client)
        self.reserved: dict[str, Sequence] = {}
        self._step: _Step | None = None
        self.last_step: tuple[float, int] = (0.0, 0)
        """(compute seconds, prompt tokens) of the latest step started."""

    # -- requests --------------------------------------------------------------------------
    def submit(self, seq: Sequence) -> None:
        """Queue a request prefilled here (``seq.handoff``: end after its first token)."""
        self.scheduler.add(seq)

    def reserve(self, seq: Sequence) -> bool:
        """Hold pages for ``seq``'s prompt (prefilled elsewhere); False if not free now."""
        if not self.scheduler.reserve(seq):
            return False
        self.reserved[seq.request_id] = seq
        return True

    def adopt(self, request_id: str, first_token: int) -> Sequence:
        """Take over a reserved request whose prompt KV landed, with its first token."""
        seq = self.reserved.pop(request_id)
        landed = seq.num_prompt_tokens - seq.num_computed_tokens
        seq.num_pool_tokens = landed
        seq.num_computed_tokens += landed
        seq.num_cached_tokens += landed
        self.scheduler.blocks.commit(seq)
        seq.token_ids.append(first_token)
        self.scheduler.resume(seq)
        return seq

    def release(self, request_id: str) -> None:
        """Give a reservation's pages back (its prefill failed)."""
        seq = self.reserved.pop(request_id, None)
        if seq is not None:
            self.scheduler.finish(seq, FinishReason.ABORT)

    @property
    def busy(self) -> bool:
        return self._step is not None

    @property
    def idle(self) -> bool:
        """Nothing queued, running, reserved or stepping (a drain is over)."""
        return not (self.busy or self.scheduler.has_work or self.reserved)

    # -- one step --------------------------------------------------------------------------
    def start_step(self) -> float | None:
        """Schedule the next batch; its duration in seconds, or None when there is none."""
        assert self._step is None, "a step is already running"
        loaded0 = self.client.loaded_blocks if self.client else 0
        batch = self.scheduler.schedule()
        if not batch:
            return None
        read = (
            self.client.loaded_blocks - loaded0 if self.client else 0
        ) * self.config.block_tokens
        compute = self.cost.step_s(shape_of(batch))
        prompt = sum(
            min(n, max(0, s.num_prompt_tokens - s.num_computed_tokens)) for s, n in batch.entries
        )
        written = prompt if self.pool is not None else 0
        seconds = compute + self.kv.read_s(read) + self.kv.exposed_s(compute, written)
        self._step = _Step(batch, sampled_in(batch), seconds, prompt)
        self.last_step = (compute, prompt)
        self.stats.pool_tokens_read += read
        return seconds

    def end_step(self) -> list[tuple[Sequence, FinishReason | None]]:
        """Apply the running step; each sampled sequence with why it ended (or None)."""
        step, self._step = self._step, None
        assert step is not None, "no step is running"
        self.scheduler.update(step.batch)
        if self.pool is not None:
            self.pool.add([h for h, _ in step.batch.committed])
        self._account(step)
        return [(seq, self._append(seq)) for seq in step.sampled if not seq.is_finished]

    def _account(self, step: _Step) -> None:
        s = self.stats
        s.steps += 1
        s.busy_s += step.seconds
        s.output_tokens += len(step.sampled)
        if step.prompt_tokens:
            s.prefill_s += step.seconds
            s.prompt_tokens_computed += step.prompt_tokens

    def _append(self, seq: Sequence) -> FinishReason | None:
        seq.token_ids.append(output_token(seq))
        reason = None
        if seq.num_output_tokens >= seq.params.max_tokens or seq.num_tokens >= self.max_model_len:
            reason = FinishReason.LENGTH
        elif seq.handoff:
            reason = FinishReason.HANDOFF
        if reason is not None:
            self.scheduler.finish(seq, reason)
        return reason

    # -- what the router sees --------------------------------------------------------------
    def load(self) -> WorkerLoad:
        """This worker's load report, as :func:`workers.serve.wire.load_report` would fill it."""
        s = self.stats
        return WorkerLoad(
            worker_id=self.worker_id,
            role=self.role,
            draining=self.draining,
            waiting=len(self.scheduler.waiting),
            running=len(self.scheduler.running),
            queued_prefill_tokens=self.scheduler.queued_prefill_tokens,
            free_pages=self.scheduler.blocks.pool.num_free,
            total_pages=self.config.num_blocks,
            prefill_tokens_per_s=s.prompt_tokens_computed / s.prefill_s if s.prefill_s else 0.0,
        )


def output_token(seq: Sequence) -> int:
    """A deterministic stand-in for the sampled token (distinct across requests, so
    generated blocks never alias between requests)."""
    salt = zlib.crc32(seq.request_id.encode())
    return FIRST_OUTPUT_TOKEN + (salt + 7919 * seq.num_tokens) % OUTPUT_TOKENS

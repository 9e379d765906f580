r"""One model engine: continuous batching over a paged KV cache, in-process.

Lifecycle:

1. ``Engine(config, pool, keyring)`` builds model, KV cache, prefix hasher and pool
   (:func:`workers.engine.parts.load_parts`; ``keyring``: :class:`kvpool.keyring.Keyring`,
   the default has no secret; a pool that cannot be reached is logged and skipped: the pool
   is a cache, never a condition of correctness) and publishes :attr:`Engine.info`;
2. :meth:`Engine.add_request` validates and queues a request (``ValueError`` if it can never
   fit); :meth:`Engine.abort` ends one at any point and frees its pages;
3. :meth:`Engine.step` schedules one batch (admission pulls further prefix blocks from the
   pool), runs the model, publishes newly full blocks to the pool, appends sampled tokens,
   ends requests that hit EOS, a stop token or string, or ``max_tokens``, and returns what
   changed;
4. :meth:`Engine.generate` drives steps until given requests finish (:mod:`workers.engine.offline`).

The serving roles use the same engine: a prefill worker adds requests with ``handoff=True``
(they end after the first token, their prompt's KV left in the pool, written layer by layer
while the step runs: :mod:`workers.handoff.pool_transfer`); a decode worker :meth:`Engine.reserve`\
s pages for a prompt before its prefill, then :meth:`Engine.adopt`\ s the request with its
first token (the prompt's KV is pulled into the reserved pages) and decodes it; reservations
whose lease ran out are released by :meth:`Engine.housekeeping`
(:mod:`workers.handoff.reservations`). A hand-off may come with a push target instead
(``add_request(push=...)`` on the prefill side, ``reserve(offer_push=True)`` and
``adopt(pushed=...)`` on the decode side): the prompt's KV is written straight into the decode
worker's pages (:mod:`workers.handoff.pusher`, :mod:`workers.handoff.push_receive`) and the pool in
the background.

Threads: every method runs on the thread that owns the engine (the engine loop's, when
served); other threads read only :attr:`Engine.info` and the :meth:`Engine.load` snapshots
(:mod:`workers.core.engine_info`).
"""

from __future__ import annotations

import logging
import time

from kvpool.chain_index import ChainIndex
from kvpool.config import PoolConfig
from kvpool.keyring import Keyring
from kvpool.push import PushTarget
from kvpool.stream import Transfer
from workers.config import EngineConfig
from workers.core.engine_info import EngineInfo, EngineLoad
from workers.core.outputs import EngineStats, RequestOutput
from workers.core.request_book import RequestBook
from workers.core.request_checks import check_params, check_resumed
from workers.core.request_table import RequestTable
from workers.core.scheduler import Scheduler
from workers.core.sequence import FinishReason, SamplingParams, Sequence, TokenLogprob
from workers.core.step_log import StepLog
from workers.engine.model_runner import describe
from workers.engine.offline import generate
from workers.engine.parts import load_parts
from workers.engine.step_exec import execute_contained
from workers.handoff.decode_side import DecodeHandoff
from workers.handoff.prefill_side import PrefillHandoff
from workers.handoff.reservations import Reservations

log = logging.getLogger(__name__)


class Engine(DecodeHandoff):
    """One engine (module docstring); the decode side of a hand-off is
    :class:`workers.handoff.decode_side.DecodeHandoff`'s."""

    def __init__(
        self,
        config: EngineConfig,
        pool: PoolConfig | None = None,
        keyring: Keyring | None = None,
        index: ChainIndex | None = None,
    ) -> None:
        self.config = config
        parts = load_parts(config, pool, keyring or Keyring(), index)
        self.model_dir, self.dtype, self.device = parts.model_dir, parts.dtype, parts.device
        self.model_config, self.namespace = parts.model_config, parts.namespace
        self.hasher, self.tokenizer, self.runner = parts.hasher, parts.tokenizer, parts.runner
        self.max_model_len, self.num_blocks = parts.max_model_len, parts.num_blocks
        self.pool = parts.pool
        self.scheduler = Scheduler(parts.scheduler_config(config), self.hasher, remote=self.pool)
        blocks, streaming = self.scheduler.blocks, config.kv_streaming
        self.prefill = (
            PrefillHandoff(self.pool, pool, blocks, streaming, config.push_after_token)
            if self.pool
            else None
        )
        """The prefill half of hand-offs: the step's pool writes and direct pushes
        (:mod:`workers.handoff.prefill_side`); None without the pool."""
        self.reservations = Reservations(self.scheduler, self.pool, config.kv_streaming)
        """The decode side of hand-offs (:mod:`workers.handoff.reservations`)."""
        self.info = EngineInfo(self.max_model_len, self.num_blocks, self.pool is not None)
        """Fixed facts, readable from any thread (:mod:`workers.core.engine_info`)."""
        self.stats = EngineStats()
        self.book = RequestBook(self.tokenizer, parts.eos_token_ids, self.max_model_len, self.stats)
        self.step_log = StepLog.open(config.step_log_dir)
        vocab = self.model_config.vocab_size
        self._requests = RequestTable(self.book, self.runner, self.reservations, vocab)

    # -- requests --------------------------------------------------------------------------
    def add_request(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        request_id: str | None = None,
        handoff: bool = False,
        cache_salt: str = "",
        push: PushTarget | None = None,
    ) -> str:
        """Queue a request; ``ValueError`` if it is invalid or can never fit.

        ``handoff``: prefill only (see the module docstring); needs the pool. ``push``
        (with ``handoff``): write the prompt's KV into a decode worker's reserved pages
        too; how it went comes on the first output (:attr:`RequestOutput.push`).
        ``cache_salt``: the request's tenant salt (it shares prefixes only with its salt).
        A reservation under the same id is superseded, so released first: the router
        prefills here after all (its prefill worker failed), or gave that ``Reserve`` up
        (e.g. a frozen worker carried it out late).
        """
        if handoff and self.prefill is None:
            raise ValueError("handing a prefill off to a decode worker needs the KV pool")
        seq = self._enqueue(
            request_id, list(prompt_token_ids), params, len(prompt_token_ids), cache_salt
        )
        seq.handoff = handoff
        if handoff and push is not None and self.prefill is not None:
            self.prefill.accept(seq, push)
        return seq.request_id

    def resume(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        output_token_ids: list[int],
        params: SamplingParams,
        cache_salt: str = "",
    ) -> Transfer:
        """Continue a request that produced ``output_token_ids`` elsewhere (a remote prefill's
        first token, or a decode worker that failed): it is queued with prompt and outputs,
        which admission reuses from the pool where present and computes otherwise; seeded
        sampling, stop strings, ``max_tokens`` and the released text go on as if it had run
        here all along. Only new tokens are reported. ``ValueError`` if nothing is left.
        A reservation under the same id is released first, as in :meth:`add_request`."""
        check_resumed(output_token_ids, params)
        tokens = [*prompt_token_ids, *output_token_ids]
        seq = self._enqueue(request_id, tokens, params, len(prompt_token_ids), cache_salt)
        self._requests.made_elsewhere(seq, list(output_token_ids))
        return Transfer()

    def _enqueue(
        self,
        request_id: str | None,
        token_ids: list[int],
        params: SamplingParams,
        prompt: int,
        cache_salt: str = "",
    ) -> Sequence:
        request_id = request_id or self._requests.new_id()
        self.reservations.release(request_id)  # superseded: see add_request
        self._requests.check_new(request_id, token_ids)
        check_params(params, self.model_config.vocab_size)
        seq = Sequence(request_id, token_ids, params, prompt, arrival_step=self.stats.steps)
        seq.queued_at = time.perf_counter()
        seq.hash_root = self.hasher.root(cache_salt)
        self.scheduler.add(seq)
        self._requests.track(seq)
        self.stats.requests += 1
        return seq

    def abort(self, request_id: str) -> bool:
        """End a request (or release a reservation) wherever it is; False if unknown."""
        if self.reservations.release(request_id):
            return True
        seq = self._requests.get(request_id)
        if seq is not None:
            self._end(seq, FinishReason.ABORT)
        return seq is not None

    def _end(self, seq: Sequence, reason: FinishReason) -> None:
        """Finish tracked ``seq`` for ``reason``: its pages back, the engine forgets it."""
        self.scheduler.finish(seq, reason)
        self._requests.forget(seq.request_id)

    def housekeeping(self, now: float | None = None) -> int:
        """Release reservations whose lease ran out and expire this worker's uncollected
        partial blocks in the pool; returns how many reservations were released."""
        expired = self.reservations.expire(now)
        if self.prefill is not None:
            self.prefill.unpin()
        if self.pool is not None:
            self.pool.partials.sweep()
        return expired

    @property
    def has_unfinished(self) -> bool:
        return self.scheduler.has_work

    @property
    def busy(self) -> bool:
        """Whether it holds any work: requests queued or running, or reservations."""
        return self.has_unfinished or bool(self.reservations)

    @property
    def num_free_blocks(self) -> int:
        return self.scheduler.blocks.num_free

    def load(self) -> EngineLoad:
        """A snapshot of the queues, counters and pool health (asks the pool client)."""
        return EngineLoad.of(self.scheduler, self.reservations, self.stats, self.pool)

    # -- one step --------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one batch; returns an output for every request that got a token or ended."""
        started = time.perf_counter()
        if self.prefill is not None:
            self.prefill.unpin()  # pages the background pool writes no longer read
        batch = self.scheduler.schedule()
        if not batch:
            return []
        self.stats.record_scheduled((entry.seq for entry in batch.entries), started)
        shape = batch.shape() if self.step_log is not None else None
        t0 = time.perf_counter()
        prompt_tokens = batch.prompt_tokens
        self.stats.prompt_tokens_computed += prompt_tokens
        done = execute_contained(self.runner, self.prefill, batch)
        for step_write, owners in done.writes:
            self.book.account(step_write, owners)
        outputs = [self._fail(seq, error) for seq, error in done.sampled.failed]
        batch.entries = [entry for entry in batch.entries if not entry.seq.is_finished]
        self.scheduler.update(batch)
        s = done.sampled
        for seq, logprobs in s.prompt_logprobs:
            seq.prompt_logprobs.extend(logprobs)
        outputs += [self._append(*new) for new in zip(s.seqs, s.tokens, s.logprobs, strict=True)]
        self.stats.record_step(prompt_tokens > 0, len(s.tokens), time.perf_counter() - t0)
        self.stats.preemptions = self.scheduler.num_preemptions
        if self.step_log is not None and shape is not None:
            self.step_log.record(shape, time.perf_counter() - started)
        return outputs

    def _fail(self, seq: Sequence, error: str) -> RequestOutput:
        """End ``seq`` because the engine failed on it alone (its pages go back)."""
        self._end(seq, FinishReason.ABORT)
        return self.book.failed(seq, error)

    def _append(self, seq: Sequence, token: int, logprob: TokenLogprob | None) -> RequestOutput:
        """``seq``'s output for its new ``token``; a request that raises here (e.g. in
        detokenization) fails alone."""
        try:
            out = self.book.output(seq, token, logprob)
        except Exception as exc:
            log.exception("finishing the step failed for %s; it fails alone", seq.request_id)
            return self._fail(seq, describe(exc))
        if self.prefill is not None:
            out.push = self.prefill.answered(seq)
        if out.finish_reason is not None:
            self._end(seq, out.finish_reason)
        return out

    def close(self) -> None:
        """Leave the pool (if joined). The engine is not usable afterwards."""
        self.reservations.close()
        if self.prefill is not None:
            self.prefill.close()
            self.prefill = None
        if self.step_log is not None:
            self.step_log.close()
            self.step_log = None
        if self.pool is not None:
            self.pool.close()
            self.pool.store.close()
            self.pool = None
            self.scheduler.remote = None

    def generate(
        self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]
    ) -> list[RequestOutput]:
        """Run ``prompts`` to completion together; outputs in prompt order (see
        :func:`workers.engine.offline.generate`)."""
        return generate(self, prompts, params)

"""What an engine hands out: per-request outputs and cumulative stats."""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field

from kvpool.push import PushOutcome
from kvpool.stream import Transfer
from workers.core.histogram import Buckets
from workers.core.sequence import FinishReason, Sequence, TokenLogprob


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
    """The whole output text, once finished (stop strings cut)."""
    text_delta: str = ""
    """Newly released text (incomplete characters and possible stop-string starts held)."""
    transfer: Transfer | None = None
    """KV this request wrote to the pool so far (engines with a pool)."""
    error: str | None = None
    """Set when the engine failed on this request alone (it is finished, ``abort``); the
    other requests of its step went on (:mod:`workers.engine.step_exec`)."""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    """One per new token, when the request asked (``SamplingParams.logprobs``)."""
    prompt_logprobs: list[TokenLogprob] | None = None
    """On the request's first output, when it asked (``SamplingParams.prompt_logprobs``):
    prompt tokens 2.. (the first has none)."""
    push: Future[PushOutcome] | None = None
    """On a hand-off's first token, when it came with a push target: how the push goes,
    set once its last layers are written (:mod:`workers.handoff.pusher`); the first token
    does not wait for it."""


@dataclass
class EngineStats:
    """Cumulative counters since start."""

    steps: int = 0
    requests: int = 0
    prompt_tokens_computed: int = 0
    prompt_tokens_cached: int = 0
    prompt_tokens_from_pool: int = 0
    output_tokens: int = 0
    preemptions: int = 0
    busy_seconds: float = 0.0
    prefill_seconds: float = 0.0
    """Time of steps that computed prompt tokens (for the measured prefill speed)."""
    decode_steps_seconds: float = 0.0
    decode_step_tokens: int = 0
    kv_write: Transfer = field(default_factory=Transfer)
    kv_read: Transfer = field(default_factory=Transfer)
    queue_time: Buckets = field(default_factory=Buckets)
    """Seconds each request waited in the queue before it was first scheduled."""

    def record_scheduled(self, seqs: Iterable[Sequence], now: float) -> None:
        """Observe the queue time of each of ``seqs`` scheduled for the first time (its
        ``queued_at`` set: ``now`` is on the same clock) and clear it, so a preempted
        request's later waits are not counted again."""
        for seq in seqs:
            if seq.queued_at is not None:
                self.queue_time.observe(max(0.0, now - seq.queued_at))
                seq.queued_at = None

    def record_step(self, prefill: bool, output_tokens: int, seconds: float) -> None:
        """Count one step that ran ``seconds`` and sampled ``output_tokens``; ``prefill``:
        it computed prompt tokens (counted before it ran), else it was a decode step."""
        self.steps += 1
        self.output_tokens += output_tokens
        self.busy_seconds += seconds
        if prefill:
            self.prefill_seconds += seconds
        else:
            self.decode_steps_seconds += seconds
            self.decode_step_tokens += output_tokens

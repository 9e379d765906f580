"""A request inside one engine: its tokens, its progress and its pages.

Lifecycle: ``WAITING`` (queued, or preempted and put back) -> ``RUNNING`` (scheduled; its
``num_computed_tokens`` grows by chunks until it reaches ``len(token_ids)``, then each step
adds one sampled token) -> ``FINISHED`` (stop, length or abort; every page is given back).
A decode worker's request may instead start ``RESERVED``: it holds pages for its prompt
before a remote prefill ran, then enters ``RUNNING`` with the prompt's KV pulled from the
pool (or gives the pages back when its lease ends).
The scheduler owns the status and the page fields; the engine appends sampled tokens.

The innermost bookkeeping of a worker: it imports only :mod:`proto.limits`; what other
modules hang on a sequence (the direct push's state) it holds as an opaque slot.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from proto.limits import (
    MIN_TEMPERATURE,
    logits_processing_error,
    logprobs_error,
    stop_error,
    stop_token_ids_count_error,
)


@dataclass(frozen=True)
class TokenLogprob:
    """One token's logprob and the ``k`` most likely tokens at its position, best first
    (:func:`workers.core.logprobs.token_logprobs`)."""

    logprob: float
    top_ids: tuple[int, ...] = ()
    top_logprobs: tuple[float, ...] = ()


class SeqStatus(enum.Enum):
    RESERVED = "reserved"
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(enum.StrEnum):
    """Why a request ended, named as OpenAI's ``finish_reason`` (``abort`` is ours)."""

    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    HANDOFF = "handoff"
    """Prefill done here; the request goes on on a decode worker (not shown to clients)."""


@dataclass(frozen=True)
class SamplingParams:
    """Per-request decoding settings; validated on construction.

    ``temperature == 0`` means greedy. ``top_k == 0`` and ``top_p == 1`` disable those
    filters. ``seed`` makes a sampled request reproducible whatever else is batched with it.
    ``stop`` strings end the request and are cut from the text; ``stop_token_ids`` and the
    model's EOS ids (unless ``ignore_eos``) end it after that token. Their counts and
    lengths are capped by :mod:`proto.limits`, as at the router.

    Logits processing (:mod:`workers.core.logits_processors`; 0, 0, 1, 0 and no bias are off):
    ``logit_bias`` (token id -> value) is added to the logits; until ``min_tokens`` output
    tokens exist, the stop tokens (``stop_token_ids``, and the EOS ids unless
    ``ignore_eos``) cannot be sampled and stop strings are not looked for;
    ``repetition_penalty`` scales the logits of every token of prompt and output (as
    transformers' ``RepetitionPenaltyLogitsProcessor``); ``presence_penalty`` and
    ``frequency_penalty`` are subtracted per output token (OpenAI's formula). Ranges and
    caps: :func:`proto.limits.logits_processing_error`. Token ids of ``logit_bias`` are
    checked against the model's vocabulary by the engine, which knows it.

    ``logprobs``: each output token comes with its logprob and this many top alternatives
    (:mod:`workers.core.logprobs`); ``prompt_logprobs``: so does each prompt token after the
    first, and the prompt is computed whole (no prefix-cache hit, local or pooled, since a
    cached position has no logits). ``None``: not asked for; at most
    :data:`proto.limits.MAX_LOGPROBS`.
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        t = self.temperature
        if not math.isfinite(t) or t < 0 or 0 < t < MIN_TEMPERATURE:
            raise ValueError(f"temperature must be 0 or in [{MIN_TEMPERATURE}, inf), got {t}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if error := stop_error(self.stop) or stop_token_ids_count_error(len(self.stop_token_ids)):
            raise ValueError(error)
        if refused := logits_processing_error(
            logit_bias=self.logit_bias,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty,
            min_tokens=self.min_tokens,
            max_tokens=self.max_tokens,
        ):
            raise ValueError(refused[1])
        for name in ("logprobs", "prompt_logprobs"):
            if error := logprobs_error(name, getattr(self, name)):
                raise ValueError(error)
        # a read-only copy: the params stay as validated whatever the caller does with its dict
        object.__setattr__(self, "logit_bias", MappingProxyType(dict(self.logit_bias)))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        """Whether any penalty is on (the sampler then needs the request's tokens)."""
        return (
            self.presence_penalty != 0
            or self.frequency_penalty != 0
            or self.repetition_penalty != 1
        )


@dataclass(eq=False)
class Sequence:
    """One request's state; ``token_ids`` holds the prompt followed by the output so far.

    Compared by identity: two requests with equal fields are still two requests.
    """

    request_id: str
    token_ids: list[int]
    params: SamplingParams
    num_prompt_tokens: int = 0
    status: SeqStatus = SeqStatus.WAITING
    finish_reason: FinishReason | None = None
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    num_pool_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    page_epoch: int = 0
    """Bumped whenever ``block_table`` is cleared (its pages given back) or one of its pages
    is swapped for a shared copy (:meth:`BlockManager.commit` with ``share``), so a copy of the
    table kept elsewhere (:class:`workers.core.block_tables.BlockTables`) knows to start over."""
    block_hashes: list[int] = field(default_factory=list)
    arrival_step: int = 0
    queued_at: float | None = None
    """When it was queued (``time.perf_counter``), until first scheduled; then None."""
    handoff: bool = False
    """Prefill only: end after the first token and leave the prompt's KV in the pool."""
    push: object | None = None
    """Prefill only: the direct push of its prompt's KV into a decode worker's pages, if
    it came with a target. Opaque here: :mod:`workers.handoff.pusher` fills and reads it (its
    ``PushState``, through ``push_state``), so the sequence imports nothing of the push."""
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)
    """Logprobs of prompt tokens 2.. (``params.prompt_logprobs``), filled as the prefill's
    chunks run; index ``i`` is the token at position ``i + 1``."""
    hash_root: int | None = None
    """Parent of the first block's hash: the root of the request's cache salt
    (:meth:`kvpool.hashing.PrefixHasher.root`; ``None``: the unsalted root); requests with
    different roots share no prefix."""

    def __post_init__(self) -> None:
        if not self.token_ids:
            raise ValueError("a request needs at least one prompt token")
        self.num_prompt_tokens = self.num_prompt_tokens or len(self.token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_uncomputed(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def num_pool_hit_tokens(self) -> int:
        """Tokens of the current prefix hit that came from the shared pool."""
        return min(self.num_pool_tokens, self.num_cached_tokens)

    @property
    def reuses_prefix(self) -> bool:
        """Whether cached KV may stand in for its prompt (not when its prompt's logprobs
        are wanted: a cached position has no logits)."""
        return self.params.prompt_logprobs is None

    @property
    def is_finished(self) -> bool:
        return self.status is SeqStatus.FINISHED

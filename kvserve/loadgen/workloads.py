"""Workloads: lists of :class:`RequestSpec`, built purely and deterministically from a seed.

No I/O library and no torch, so a discrete-event simulator can replay exactly the requests
that ``kvserve bench serve`` sends. Every prompt is a tuple of token ids in ``[100, vocab)``
(ids below 100 are left alone: special tokens live there in the models we serve).

- :func:`synthetic_requests`: ``prefill-heavy`` / ``decode-heavy`` / ``mixed`` length
  distributions (:class:`Lengths`: uniform in ``mean * [1 - spread, 1 + spread]``, rounded,
  at least 1; ``mixed`` alternates a prefill-heavy and a decode-heavy request);
- :func:`shared_prefix_requests`: request ``i`` belongs to group ``i % groups`` and is that
  group's ``prefix_len``-token prefix followed by its own unique suffix;
- :func:`trace_requests`: Mooncake trace replay. Every ``hash_id`` names one block of
  ``block_size`` trace tokens; its tokens are derived from ``(seed, hash_id)`` only
  (:func:`block_tokens`), so equal ids give equal blocks and different ids different blocks
  (the first two tokens encode the id), which reproduces the trace's prefix sharing. With a
  ``length_scale`` each full block becomes ``max(1, round(block_size * length_scale))``
  tokens and the last (partial) block ``max(1, round(last * length_scale))`` tokens, where
  ``last = input_length - block_size * (len(hash_ids) - 1)`` clamped to ``[1, block_size]``;
  a partial block is a prefix of the same id's full block. Output lengths become
  ``min(cap, max(1, round(output_length * output_scale)))``; arrival times are the trace's
  timestamps in seconds (``arrival_s``; :mod:`.arrivals` rescales them).

Synthetic workloads leave ``arrival_s`` at 0: :func:`with_arrivals` sets it.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from dataclasses import dataclass

from kvserve.loadgen.mooncake_trace import TraceEntry

MIN_TOKEN = 100
DEFAULT_VOCAB = 49152
SYNTHETIC_KINDS = ("prefill-heavy", "decode-heavy", "mixed")


@dataclass(frozen=True)
class RequestSpec:
    """One request to send: when (``arrival_s`` from the run's start), what, how long;
    ``conversation`` and ``turn`` place a conversation's turn (:mod:`.conversation`), -1
    for a request of no conversation."""

    index: int
    arrival_s: float
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    group: int = -1  # shared-prefix group, or -1
    conversation: int = -1
    turn: int = -1

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)


@dataclass(frozen=True)
class Lengths:
    """A length distribution: uniform integers in ``mean * [1 - spread, 1 + spread]``."""

    mean: int
    spread: float = 0.0

    def __post_init__(self) -> None:
        if self.mean < 1 or not 0.0 <= self.spread < 1.0:
            raise ValueError(f"lengths need mean >= 1 and 0 <= spread < 1, got {self}")

    def sample(self, rng: random.Random) -> int:
        low = max(1, round(self.mean * (1 - self.spread)))
        high = max(low, round(self.mean * (1 + self.spread)))
        return rng.randint(low, high)


@dataclass(frozen=True)
class SyntheticShape:
    """Input and output lengths of one synthetic kind."""

    input: Lengths
    output: Lengths


# Sized for a 2-core CPU serving a 135M model: every length is a flag of bench serve.
DEFAULT_SHAPES = {
    "prefill-heavy": SyntheticShape(Lengths(512, 0.25), Lengths(16, 0.25)),
    "decode-heavy": SyntheticShape(Lengths(64, 0.25), Lengths(128, 0.25)),
}


def random_tokens(
    rng: random.Random, n: int, vocab: int = DEFAULT_VOCAB, low: int = MIN_TOKEN
) -> tuple[int, ...]:
    """``n`` token ids drawn from ``[low, vocab)`` by ``rng``."""
    return tuple(rng.randrange(low, vocab) for _ in range(n))


def synthetic_requests(
    kind: str,
    n: int,
    seed: int,
    shapes: dict[str, SyntheticShape] | None = None,
    vocab: int = DEFAULT_VOCAB,
) -> list[RequestSpec]:
    """``n`` requests of ``kind`` (one of :data:`SYNTHETIC_KINDS`) with random prompts."""
    if kind not in SYNTHETIC_KINDS:
        raise ValueError(f"unknown synthetic workload {kind!r}; one of {SYNTHETIC_KINDS}")
    table = shapes or DEFAULT_SHAPES
    order = ["prefill-heavy", "decode-heavy"] if kind == "mixed" else [kind]
    rng = random.Random(seed)
    specs = []
    for i in range(n):
        shape = table[order[i % len(order)]]
        prompt = random_tokens(rng, shape.input.sample(rng), vocab)
        specs.append(RequestSpec(i, 0.0, prompt, shape.output.sample(rng)))
    return specs


def shared_prefix_requests(
    n: int,
    seed: int,
    groups: int,
    prefix_len: int,
    suffix: Lengths,
    output: Lengths,
    vocab: int = DEFAULT_VOCAB,
) -> list[RequestSpec]:
    """Request ``i``: group ``i % groups``'s prefix + a unique suffix (``group`` is set)."""
    if groups < 1 or prefix_len < 0:
        raise ValueError("shared-prefix needs groups >= 1 and prefix_len >= 0")
    rng = random.Random(seed)
    prefixes = [random_tokens(rng, prefix_len, vocab) for _ in range(groups)]
    specs = []
    for i in range(n):
        tail = random_tokens(rng, suffix.sample(rng), vocab)
        specs.append(
            RequestSpec(i, 0.0, prefixes[i % groups] + tail, output.sample(rng), i % groups)
        )
    return specs


@dataclass(frozen=True)
class TraceOptions:
    """How a trace is replayed (every field is recorded in the run's conditions)."""

    block_size: int = 512
    length_scale: float = 1.0
    output_scale: float = 1.0
    output_cap: int = 0  # 0: no cap
    max_requests: int = 0  # 0: all

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.length_scale <= 0 or self.output_scale <= 0:
            raise ValueError(f"trace options must be positive, got {self}")

    @property
    def scaled_block(self) -> int:
        return max(1, round(self.block_size * self.length_scale))


def block_tokens(seed: int, hash_id: int, n: int, vocab: int = DEFAULT_VOCAB) -> tuple[int, ...]:
    """The ``n`` tokens of trace block ``hash_id``: a function of ``(seed, hash_id)`` only.

    The first two tokens are ``hash_id``'s two low digits in base ``vocab - 100``, each shifted
    by an offset drawn from the seed alone, so two ids below ``(vocab - 100) ** 2`` never share
    a block of two or more tokens (nor ids below ``vocab - 100`` a one-token block); the rest
    are random from a generator seeded with ``"seed/hash_id"`` (stable across processes).
    """
    width = vocab - MIN_TOKEN
    per_seed = random.Random(f"{seed}/offsets")  # offsets per seed only: a bijection per id
    offsets = (per_seed.randrange(width), per_seed.randrange(width))
    rng = random.Random(f"{seed}/{hash_id}")
    digits = (hash_id, hash_id // width)  # low digit first: one-token blocks differ too
    head = tuple(MIN_TOKEN + (d + o) % width for d, o in zip(digits, offsets, strict=True))
    return (head + random_tokens(rng, max(0, n - 2), vocab))[:n]


def trace_prompt(entry: TraceEntry, seed: int, opts: TraceOptions, vocab: int) -> tuple[int, ...]:
    """The scaled prompt of one trace entry (module docstring: block mapping)."""
    if not entry.hash_ids:
        return block_tokens(seed, -1, max(1, round(entry.input_length * opts.length_scale)), vocab)
    full = opts.scaled_block
    last_len = entry.input_length - opts.block_size * (len(entry.hash_ids) - 1)
    last = max(1, round(min(max(last_len, 1), opts.block_size) * opts.length_scale))
    sizes = [full] * (len(entry.hash_ids) - 1) + [last]
    prompt: tuple[int, ...] = ()
    for hash_id, size in zip(entry.hash_ids, sizes, strict=True):
        prompt += block_tokens(seed, hash_id, full, vocab)[:size]
    return prompt


def trace_output_len(entry: TraceEntry, opts: TraceOptions) -> int:
    n = max(1, round(entry.output_length * opts.output_scale))
    return min(n, opts.output_cap) if opts.output_cap > 0 else n


def trace_requests(
    entries: Sequence[TraceEntry], seed: int, opts: TraceOptions, vocab: int = DEFAULT_VOCAB
) -> list[RequestSpec]:
    """Requests replaying ``entries`` (the first ``opts.max_requests`` if set)."""
    chosen = entries[: opts.max_requests] if opts.max_requests > 0 else entries
    return [
        RequestSpec(
            i,
            e.timestamp_ms / 1000.0,
            trace_prompt(e, seed, opts, vocab),
            trace_output_len(e, opts),
        )
        for i, e in enumerate(chosen)
    ]


def with_arrivals(specs: Sequence[RequestSpec], times_s: Sequence[float]) -> list[RequestSpec]:
    """The same requests with new arrival times (one per request, in order)."""
    if len(specs) != len(times_s):
        raise ValueError(f"{len(specs)} requests but {len(times_s)} arrival times")
    return [dataclasses.replace(s, arrival_s=t) for s, t in zip(specs, times_s, strict=True)]


def salted(
    specs: Sequence[RequestSpec], salt: int, vocab: int = DEFAULT_VOCAB
) -> list[RequestSpec]:
    """The same requests with every token shifted by ``salt * 7919`` (mod the id range).

    A bijection on token ids: lengths, arrivals and which prompts share which prefix stay
    the same, the tokens differ, so runs with different salts never hit each other's cache.
    """
    return [
        dataclasses.replace(s, prompt_token_ids=salt_tokens(s.prompt_token_ids, salt, vocab))
        for s in specs
    ]


def salt_tokens(tokens: Sequence[int], salt: int, vocab: int = DEFAULT_VOCAB) -> tuple[int, ...]:
    """``tokens`` shifted by ``salt * 7919`` within ``[100, vocab)`` (:func:`salted`)."""
    width = vocab - MIN_TOKEN
    shift = salt * 7919
    return tuple(MIN_TOKEN + (t - MIN_TOKEN + shift) % width for t in tokens)

"""Limits on request fields, shared by both entrances: the router's HTTP edge and the
workers' gRPC edge check the same values, so nothing the router refuses is accepted by a
worker called directly.

The ``*_error`` functions return the refusal's message (naming the field and the limit) or
``None``; the router answers it as a 400 on ``param`` ``stop``, a worker as a ``ValueError``
(gRPC ``INVALID_ARGUMENT``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

MIN_TEMPERATURE = 1e-5
"""The smallest non-zero sampling temperature (0 is greedy). Below it, logits divided by
the temperature overflow fp32 and the probabilities become NaN (as vLLM, which treats
such values as greedy; here they are refused)."""

MAX_STOP_STRINGS = 32
"""Most stop strings in one request. OpenAI allows 4 and vLLM sets no cap; clients such as
evaluation harnesses and agent frameworks send a handful to a dozen (end-of-turn markers of
several chat templates, "\\n\\nQuestion:"...), so 32 is generous. Every generated token is
matched against each of them (:mod:`workers.core.detokenizer`), so the count bounds that work."""

MAX_STOP_STRING_CHARS = 1024
"""Longest stop string, in characters (code points, as Python's ``len``). Real ones are
markers or short phrases (tens of characters). Together with :data:`MAX_STOP_STRINGS` it
bounds a token's stop-string search to about 32 x (1023 + the token's text) characters, and
the text a stream holds back (a possible start of a stop string) to 1023 characters. At both
caps, with stop strings and text made to defeat the search, a token costs about 60 us."""

MAX_STOP_TOKEN_IDS = 256
"""Most ``stop_token_ids`` in one request (a worker's gRPC extension; the router sends
none). 256 covers a model's whole block of special tokens (Llama 3 reserves 256), and
bounds the per-token check ``token in stop_token_ids``."""


def stop_count_error(count: int) -> str | None:
    """The refusal of ``count`` stop strings (over :data:`MAX_STOP_STRINGS`), or ``None``;
    takes a count so that a worker can check a message before copying its list."""
    return _too_many("stop", count, MAX_STOP_STRINGS)


def stop_token_ids_count_error(count: int) -> str | None:
    """The refusal of ``count`` stop token ids (over :data:`MAX_STOP_TOKEN_IDS`), or
    ``None``."""
    return _too_many("stop_token_ids", count, MAX_STOP_TOKEN_IDS)


def stop_error(stop: Sequence[str]) -> str | None:
    """Why the stop strings ``stop`` are refused: more than :data:`MAX_STOP_STRINGS`, an
    empty one, or one longer than :data:`MAX_STOP_STRING_CHARS`; ``None`` if they are fine."""
    if error := stop_count_error(len(stop)):
        return error
    if any(not s for s in stop):
        return "stop strings must not be empty"
    longest = max(map(len, stop), default=0)
    if longest > MAX_STOP_STRING_CHARS:
        return (
            f"stop strings must be at most {MAX_STOP_STRING_CHARS} characters long, "
            f"got one of {longest}"
        )
    return None


def _too_many(field: str, count: int, limit: int) -> str | None:
    if count > limit:
        return f"{field} must have at most {limit} items, got {count}"
    return None


MAX_REQUEST_ID_CHARS = 128
REQUEST_ID_PATTERN = re.compile(r"[A-Za-z0-9._:-]+")
"""What a request id may be made of: pool keys and log lines carry it, so no ``/``,
whitespace or control characters (the router's are uuid4 hex)."""

MAX_LEASE_S = 3600.0
"""Longest decode reservation lease: the router's setting is capped by it, and a worker
refuses a ``Reserve`` that asks for more (pages pinned for days would starve everyone)."""


def request_id_error(request_id: str) -> str | None:
    """Why ``request_id`` is refused (empty, too long, or outside
    :data:`REQUEST_ID_PATTERN`), or ``None``."""
    if not request_id or len(request_id) > MAX_REQUEST_ID_CHARS:
        return f"request_id must have 1 to {MAX_REQUEST_ID_CHARS} characters"
    if not REQUEST_ID_PATTERN.fullmatch(request_id):
        return "request_id may contain only letters, digits and . _ : -"
    return None


MAX_CACHE_SALT_CHARS = 256
"""Longest ``cache_salt`` (a tenant's name for its prefix cache)."""


# -- logits processing (logit_bias, penalties, min_tokens) ---------------------------------

MAX_LOGIT_BIAS = 300
"""Most ``logit_bias`` entries in one request (OpenAI's cap). Each sampling step of such a
request scatters that many values into its logits row."""

MAX_ABS_LOGIT_BIAS = 100.0
"""A ``logit_bias`` value lies in [-100, 100] (OpenAI's range): -100 bans a token in
effect, +100 makes it all but certain."""

MAX_ABS_PENALTY = 2.0
"""``presence_penalty`` and ``frequency_penalty`` lie in [-2, 2] (OpenAI's range)."""

REPETITION_PENALTY_RANGE = (0.01, 100.0)
"""Inclusive bounds of ``repetition_penalty`` (1 is off). vLLM takes any positive value;
these bounds keep penalized fp32 logits finite (a logit of ~1e3 becomes at most ~1e5, and
~1e10 after the smallest temperature) so that no accepted value can make a NaN, while every
value used in practice (about 0.5 to 2) stays in."""

MAX_TOKEN_ID = (1 << 32) - 1
"""The largest token id the wire can carry (``uint32``); a worker also checks ids against
its own vocabulary."""


def logit_bias_count_error(count: int) -> str | None:
    """The refusal of ``count`` ``logit_bias`` entries (over :data:`MAX_LOGIT_BIAS`), or
    ``None``; takes a count so that a worker can check a message before copying its map."""
    return _too_many("logit_bias", count, MAX_LOGIT_BIAS)


def logit_bias_error(bias: Mapping[int, float]) -> str | None:
    """Why ``bias`` (token id -> value) is refused: too many entries, an id outside
    [0, :data:`MAX_TOKEN_ID`], or a value that is not finite or outside
    ±:data:`MAX_ABS_LOGIT_BIAS`; ``None`` if it is fine."""
    if error := logit_bias_count_error(len(bias)):
        return error
    for token, value in bias.items():
        if not 0 <= token <= MAX_TOKEN_ID:
            return f"logit_bias token ids must be in [0, {MAX_TOKEN_ID}], got {token}"
        if not _within(value, -MAX_ABS_LOGIT_BIAS, MAX_ABS_LOGIT_BIAS):
            return (
                f"logit_bias values must be in [{-MAX_ABS_LOGIT_BIAS:g}, {MAX_ABS_LOGIT_BIAS:g}], "
                f"got {value} for token {token}"
            )
    return None


def penalty_error(field: str, value: float) -> str | None:
    """Why ``value`` of ``presence_penalty`` or ``frequency_penalty`` (named by ``field``)
    is refused (not finite, or outside ±:data:`MAX_ABS_PENALTY`), or ``None``."""
    if _within(value, -MAX_ABS_PENALTY, MAX_ABS_PENALTY):
        return None
    return f"{field} must be in [{-MAX_ABS_PENALTY:g}, {MAX_ABS_PENALTY:g}], got {value}"


def repetition_penalty_error(value: float) -> str | None:
    """Why ``value`` of ``repetition_penalty`` is refused (outside
    :data:`REPETITION_PENALTY_RANGE`, or not finite), or ``None``."""
    low, high = REPETITION_PENALTY_RANGE
    if _within(value, low, high):
        return None
    return f"repetition_penalty must be in [{low:g}, {high:g}] (1 is off), got {value}"


def min_tokens_error(min_tokens: int, max_tokens: int | None) -> str | None:
    """Why ``min_tokens`` is refused (negative, or over ``max_tokens`` when that is known),
    or ``None``."""
    if min_tokens < 0:
        return f"min_tokens must be at least 0, got {min_tokens}"
    if max_tokens is not None and min_tokens > max_tokens:
        return f"min_tokens ({min_tokens}) must not exceed max_tokens ({max_tokens})"
    return None


def logits_processing_error(
    *,
    logit_bias: Mapping[int, float],
    presence_penalty: float,
    frequency_penalty: float,
    repetition_penalty: float,
    min_tokens: int,
    max_tokens: int | None,
) -> tuple[str, str] | None:
    """The first refused logits-processing field of a request and why, as ``(field,
    message)``, or ``None``: what both entrances check (the router answers it as a 400 on
    ``field``, a worker as a ``ValueError``). ``max_tokens`` ``None``: not known yet."""
    errors = (
        ("logit_bias", logit_bias_error(logit_bias)),
        ("presence_penalty", penalty_error("presence_penalty", presence_penalty)),
        ("frequency_penalty", penalty_error("frequency_penalty", frequency_penalty)),
        ("repetition_penalty", repetition_penalty_error(repetition_penalty)),
        ("min_tokens", min_tokens_error(min_tokens, max_tokens)),
    )
    return next(((field, error) for field, error in errors if error), None)


MAX_LOGPROBS = 20
"""The most top alternatives a token's logprobs may list (OpenAI's ``top_logprobs`` and
vLLM's default cap): each costs a top-k over the vocabulary and bytes per token."""


def logprobs_error(field: str, count: int | None) -> str | None:
    """Why ``count`` alternatives for ``field`` (``logprobs``, ``top_logprobs``,
    ``prompt_logprobs``) are refused (negative or over :data:`MAX_LOGPROBS`), or ``None``
    (``None``: not asked for)."""
    if count is None or 0 <= count <= MAX_LOGPROBS:
        return None
    return f"{field} must be in [0, {MAX_LOGPROBS}], got {count}"


def _within(value: float, low: float, high: float) -> bool:
    """``low <= value <= high`` for a finite ``value`` (NaN and infinities are outside)."""
    return math.isfinite(value) and low <= value <= high

"""Limits on request fields, shared by both entrances: the router's HTTP edge and the
workers' gRPC edge check the same values, so nothing the router refuses is accepted by a
worker called directly.

The ``*_error`` functions return the refusal's message (naming the field and the limit) or
``None``; the router answers it as a 400 on ``param`` ``stop``, a worker as a ``ValueError``
(gRPC ``INVALID_ARGUMENT``).
"""

from __future__ import annotations

from collections.abc import Sequence

MIN_TEMPERATURE = 1e-5
"""The smallest non-zero sampling temperature (0 is greedy). Below it, logits divided by
the temperature overflow fp32 and the probabilities become NaN (as vLLM, which treats
such values as greedy; here they are refused)."""

MAX_STOP_STRINGS = 32
"""Most stop strings in one request. OpenAI allows 4 and vLLM sets no cap; clients such as
evaluation harnesses and agent frameworks send a handful to a dozen (end-of-turn markers of
several chat templates, "\\n\\nQuestion:"...), so 32 is generous. Every generated token is
matched against each of them (:mod:`workers.detokenizer`), so the count bounds that work."""

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

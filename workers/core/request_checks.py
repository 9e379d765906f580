"""What an engine checks of a request before it queues, reserves or adopts it.

Each check raises ``ValueError`` (the servicer answers INVALID_ARGUMENT) and changes
nothing. They are the checks that need the engine: the model's vocabulary and the ids the
engine already holds. The wire limits (request id format, token counts, cache salt) are
checked earlier, at the RPC edge (:mod:`proto.limits`, ``WorkerServicer._check``);
:class:`workers.core.sequence.SamplingParams` checks its own fields; whether a request can ever
fit the KV cache is :meth:`workers.core.scheduler.Scheduler.check_fits`.
"""

from __future__ import annotations

from collections.abc import Container, Iterable

from workers.core.sequence import SamplingParams


def check_token_ids(token_ids: Iterable[int], vocab_size: int, what: str) -> None:
    """``ValueError`` unless every id of ``token_ids`` is in ``[0, vocab_size)``."""
    if any(not 0 <= t < vocab_size for t in token_ids):
        raise ValueError(f"{what} must be in [0, {vocab_size})")


def check_params(params: SamplingParams, vocab_size: int) -> None:
    """What :class:`SamplingParams` cannot check alone: its token ids fit the model."""
    check_token_ids(params.logit_bias, vocab_size, "logit_bias token ids")


def check_new(
    request_id: str, token_ids: list[int], vocab_size: int, held: Iterable[Container[str]]
) -> None:
    """``ValueError`` if ``request_id`` is in any of ``held`` (the engine's requests and
    reservations: an id names one request at a time) or a token id is outside the
    vocabulary."""
    if any(request_id in ids for ids in held):
        raise ValueError(f"request id {request_id!r} is already in use")
    check_token_ids(token_ids, vocab_size, "prompt token ids")


def check_resumed(output_token_ids: list[int], params: SamplingParams) -> None:
    """``ValueError`` unless a request resumed after ``output_token_ids`` (made elsewhere)
    has at least one and still has a token left to make."""
    if not output_token_ids or len(output_token_ids) >= params.max_tokens:
        raise ValueError("a resumed request needs 1 to max_tokens - 1 output tokens")

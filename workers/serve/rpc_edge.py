"""What the gRPC servicer checks of a call before the engine sees it, and how an engine
output becomes the call's status.

Checks (each returns the INVALID_ARGUMENT detail, or ``None``), made before any repeated
field is copied: :func:`request_error` (request id, cache salt, tokens against the model
length: the same limits as the router's, :mod:`proto.limits`) and :func:`lease_error`
(``Reserve``'s lease, at most :data:`proto.limits.MAX_LEASE_S`). What needs the engine
(vocabulary, ids in use) is checked there (:mod:`workers.core.request_checks`).

Outcomes: :func:`delivered` passes an output on or ends the call (INTERNAL when the engine
failed on the request, ABORTED when an ``Abort`` call ended it: :func:`aborted`).
"""

from __future__ import annotations

from typing import Any

import grpc

from proto import worker_pb2 as pb
from proto.limits import MAX_CACHE_SALT_CHARS, MAX_LEASE_S, request_id_error
from workers.core.outputs import RequestOutput
from workers.core.sequence import FinishReason

Request = pb.ReserveRequest | pb.PrefillRequest | pb.GenerateRequest
DEFAULT_LEASE_MS = 30_000
"""``Reserve``'s lease when the call gives none."""


def request_error(request: Request, max_model_len: int) -> str | None:
    """Why ``request`` is refused: a malformed request id, a cache salt over
    :data:`~proto.limits.MAX_CACHE_SALT_CHARS`, or more tokens (prompt, plus the resumed
    ones of a ``Generate``) than ``max_model_len``; ``None`` if none of these."""
    if error := request_id_error(request.request_id):
        return error
    if len(request.cache_salt) > MAX_CACHE_SALT_CHARS:
        return f"cache_salt must be at most {MAX_CACHE_SALT_CHARS} characters"
    tokens = len(request.prompt_token_ids)
    if isinstance(request, pb.GenerateRequest):
        tokens += len(request.resume_token_ids)
    if tokens > max_model_len:
        return f"the request has {tokens} tokens; this worker's model length is {max_model_len}"
    return None


def lease_error(lease_ms: int) -> str | None:
    """Why a ``Reserve`` lease of ``lease_ms`` is refused (over ``MAX_LEASE_S``), or ``None``."""
    if lease_ms > MAX_LEASE_S * 1000:
        return f"lease_ms must be at most {MAX_LEASE_S * 1000:g}"
    return None


def lease_seconds(lease_ms: int) -> float:
    """A checked lease in seconds (0: :data:`DEFAULT_LEASE_MS`)."""
    return (lease_ms or DEFAULT_LEASE_MS) / 1000


def aborted(request_id: str) -> RequestOutput:
    """The last output of a request ended by an ``Abort`` call while its own call was open."""
    return RequestOutput(request_id, [], [], [], finished=True, finish_reason=FinishReason.ABORT)


def _failure(out: RequestOutput | None) -> str:
    """The INTERNAL status detail for a request the engine failed on (``None``: the whole
    engine failed and dropped it)."""
    if out is None or out.error is None:
        return "the engine failed"
    return f"the engine failed on this request: {out.error}"


async def delivered(
    out: RequestOutput | None, context: grpc.aio.ServicerContext[Any, Any]
) -> RequestOutput:
    """``out``, or the call aborted: INTERNAL if the engine failed on the request, ABORTED if
    an ``Abort`` call ended it."""
    if out is None or out.error is not None:
        await context.abort(grpc.StatusCode.INTERNAL, _failure(out))
    if out.finish_reason is FinishReason.ABORT and not out.new_token_ids:
        await context.abort(grpc.StatusCode.ABORTED, "the request was aborted (Abort)")
    return out

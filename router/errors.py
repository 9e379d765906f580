"""Errors that reach the client, in OpenAI's format.

Body: ``{"error": {"message": str, "type": str, "param": str | None, "code": str | None}}``
with the HTTP status of :class:`APIError`, plus its ``headers`` (``Retry-After`` of a 429,
``WWW-Authenticate`` of a 401). ``type`` is ``invalid_request_error`` for every 4xx but
429, ``rate_limit_error`` for 429 (the request was valid, the server is too busy for it
now), and ``server_error`` for 5xx.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


class APIError(Exception):
    """A request failed with an HTTP status the client can read; nothing else fails."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers: dict[str, str] = dict(headers or {})
        self.counted = False  # set once a request flow has counted it in the metrics

    @property
    def type(self) -> str:
        if self.status == 429:
            return "rate_limit_error"
        return "invalid_request_error" if self.status < 500 else "server_error"

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def invalid(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param, code)


def unavailable(message: str) -> APIError:
    return APIError(503, message, None, "service_unavailable")


def too_busy(message: str, retry_after_s: float) -> APIError:
    """429 ``rate_limit_exceeded`` with ``Retry-After``: whole seconds, at least 1."""
    seconds = max(1, math.ceil(retry_after_s)) if math.isfinite(retry_after_s) else 1
    return APIError(429, message, None, "rate_limit_exceeded", {"Retry-After": str(seconds)})

"""Errors that reach the client, in OpenAI's format.

Body: ``{"error": {"message": str, "type": str, "param": str | None, "code": str | None}}``
with the HTTP status of :class:`APIError`. ``type`` is ``invalid_request_error`` for every
4xx and ``server_error`` for 5xx, as OpenAI's API does.
"""

from __future__ import annotations

from typing import Any


class APIError(Exception):
    """A request failed with an HTTP status the client can read; nothing else fails."""

    def __init__(
        self, status: int, message: str, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.counted = False  # set once a request flow has counted it in the metrics

    @property
    def type(self) -> str:
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

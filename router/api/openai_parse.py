"""A raw JSON body to a request model, every problem phrased and coded as OpenAI's 400s."""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel, ValidationError

from router.errors import APIError, invalid

Request = TypeVar("Request", bound=BaseModel)


def parse_request(cls: type[Request], body: bytes) -> Request:
    """``cls`` from a JSON body; any problem becomes a 400 :class:`APIError`."""
    try:
        return cls.model_validate_json(body)
    except ValidationError as exc:
        raise validation_error(exc) from None


def validation_error(exc: ValidationError) -> APIError:
    """The first problem of ``exc``, phrased and coded like OpenAI's errors.

    Of the errors for the first bad field (a union field reports one per branch), the most
    specific one (deepest location) is shown.
    """
    errors = exc.errors(include_url=False)
    field_errors = [e for e in errors if e["loc"][:1] == errors[0]["loc"][:1]]
    err = max(field_errors, key=lambda e: len(e["loc"]))
    kind = str(err["type"])
    param = _param(err["loc"])
    if kind == "json_invalid":
        return invalid(f"We could not parse the JSON body of your request: {err['msg']}")
    if kind == "missing":
        return invalid(
            f"Missing required parameter: '{param}'.", param, "missing_required_parameter"
        )
    code = "invalid_type" if kind.endswith(("_type", "_parsing")) else "invalid_value"
    where = f" for '{param}'" if param else ""
    return invalid(f"Invalid value{where}: {err['msg']}.", param, code)


_UNION_TAGS = frozenset({"str", "int", "float", "bool"})


def _param(loc: tuple[int | str, ...]) -> str | None:
    """``messages.0.content`` style path, without pydantic's union-branch tags."""
    parts = [str(p) for p in loc if isinstance(p, int) or not ("[" in p or p in _UNION_TAGS)]
    return ".".join(parts) or None

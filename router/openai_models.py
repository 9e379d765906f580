"""The OpenAI request bodies the router accepts (pydantic lives here, at the HTTP edge only).

:func:`parse_request` turns a raw body into a request model or an :class:`APIError` (400)
in OpenAI's error format; :meth:`check` methods reject what is well-typed but unsupported
(``n`` > 1, ``echo``, logprobs, tools...). Unknown fields are ignored, as OpenAI-compatible
servers do, so that clients sending extra defaults keep working. Types are strict, as
OpenAI's are: ``"max_tokens": "5"`` or ``"stream": 1`` is a 400, not a guess (a JSON integer
is still a valid number).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from proto.limits import MIN_TEMPERATURE, stop_error
from router.errors import APIError, invalid

TokenId = Annotated[int, Field(ge=0, lt=1 << 32)]
TokenCount = Annotated[int, Field(ge=1, lt=1 << 32)]
MAX_SEED = (1 << 64) - 1
MAX_CACHE_SALT = 256


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    include_usage: bool = False


class SamplingFields(BaseModel):
    """Fields shared by completions and chat completions."""

    model_config = ConfigDict(extra="ignore", strict=True)

    model: str
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=-1, lt=1 << 32)] | None = None  # extension; -1, 0 = off
    ignore_eos: bool = False  # extension (as vLLM's): generate max_tokens whatever comes
    seed: Annotated[int, Field(ge=0, le=MAX_SEED)] | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    user: str | None = None
    cache_salt: Annotated[str, Field(max_length=MAX_CACHE_SALT)] | None = None
    """Extension, as vLLM's: requests with different salts share no cached prefix."""

    @property
    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def check_sampling(self) -> None:
        if self.n != 1:
            raise invalid("only n=1 is supported", "n", "unsupported_value")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) not in (None, 0.0):
                raise invalid(f"{name} is not supported (only 0)", name, "unsupported_value")
        if error := stop_error(self.stop_list):
            raise invalid(error, "stop", "invalid_value")
        if self.temperature is not None and 0 < self.temperature < MIN_TEMPERATURE:
            raise invalid(
                f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE}",
                "temperature",
                "invalid_value",
            )


class CompletionRequest(SamplingFields):
    """``POST /v1/completions``: a prompt as text or token ids, or a one-element list of
    either."""

    prompt: str | list[TokenId] | list[str] | list[list[TokenId]]
    max_tokens: TokenCount | None = 16
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None

    def check(self) -> None:
        self.check_sampling()
        if self.echo:
            raise invalid("echo is not supported", "echo", "unsupported_value")
        if self.logprobs is not None:
            raise invalid("logprobs are not supported", "logprobs", "unsupported_value")
        if self.best_of not in (None, 1):
            raise invalid("only best_of=1 is supported", "best_of", "unsupported_value")
        if self.suffix:
            raise invalid("suffix is not supported", "suffix", "unsupported_value")
        self.prompt_input()

    def prompt_input(self) -> str | list[int]:
        """The one prompt: text, or token ids (a batch of prompts is refused)."""
        p = self.prompt
        if isinstance(p, str):
            return p
        if not p:
            raise invalid("prompt must not be empty", "prompt", "invalid_value")
        if isinstance(p[0], int):
            return [int(t) for t in p if isinstance(t, int)]
        if len(p) != 1:
            raise invalid("only one prompt per request is supported", "prompt", "unsupported_value")
        one = p[0]
        return one if isinstance(one, str) else [int(t) for t in one]


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def to_template(self) -> dict[str, str]:
        """The message as the chat template takes it (``developer`` speaks as ``system``)."""
        content = self.content
        text = content if isinstance(content, str) else "".join(p.text for p in content or [])
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


class ChatCompletionRequest(SamplingFields):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage]
    max_tokens: TokenCount | None = None
    max_completion_tokens: TokenCount | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    response_format: Any = None

    def check(self) -> None:
        self.check_sampling()
        if not self.messages:
            raise invalid("messages must not be empty", "messages", "invalid_value")
        if self.logprobs or self.top_logprobs:
            raise invalid("logprobs are not supported", "logprobs", "unsupported_value")
        if self.tools:
            raise invalid("tools are not supported", "tools", "unsupported_value")
        if self.response_format is not None and self.response_format != {"type": "text"}:
            raise invalid(
                "response_format is not supported", "response_format", "unsupported_value"
            )

    @property
    def output_limit(self) -> int | None:
        """The requested completion length (``max_completion_tokens`` wins), if any."""
        return self.max_completion_tokens or self.max_tokens


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

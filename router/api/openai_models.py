"""The OpenAI request bodies the router accepts (pydantic lives here, at the HTTP edge only).

:func:`router.api.openai_parse.parse_request` turns a raw body into one of these models or an
:class:`APIError` (400) in OpenAI's error format; :meth:`check` methods reject what is
well-typed but unsupported or out of range. Types are strict, as OpenAI's are:
``"max_tokens": "5"`` or ``"stream": 1`` is a 400, not a guess (a JSON integer is still a
valid number).

Every request field of OpenAI's (completions and chat completions) and vLLM's sampling
extensions is implemented or refused, never silently dropped:

- implemented: the declared fields; ``logit_bias``, the penalties, ``min_tokens`` and
  ``stop_token_ids`` within the limits of :mod:`proto.limits` that workers check too;
  ``return_token_ids`` (vLLM's) adds the token ids to the answer (:mod:`router.api.responses`);
  ``n`` samples per prompt (up to :data:`MAX_N`); ``logprobs`` (a completion's count, a
  chat's flag with ``top_logprobs``) and a completion's ``echo`` (with ``logprobs``: the
  prompt tokens' logprobs too), up to :data:`proto.limits.MAX_LOGPROBS` alternatives;
- refused: :data:`router.api.openai_fields.REFUSED`, fields whose value other than "off" would
  change the output or the answer's shape (tools, structured output, beam search,
  ``best_of``...): a 400 naming the field, code ``unsupported_value``. Null, or one of the
  listed "off" values, passes;
- ignored: :data:`router.api.openai_fields.IGNORED`, fields that do not change what is
  generated (``user``, ``store``, ``metadata``, ``service_tier``...).

Names in none of these (no OpenAI or vLLM field) are ignored, as OpenAI-compatible
servers do, so that clients sending extras meant for other servers keep working.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Annotated, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from proto import worker_pb2 as pb
from proto.limits import (
    MAX_CACHE_SALT_CHARS,
    MAX_LOGPROBS,
    MIN_TEMPERATURE,
    logit_bias_count_error,
    logits_processing_error,
    stop_error,
    stop_token_ids_count_error,
)
from router.api.openai_fields import REFUSED, Off, is_off
from router.api.openai_messages import ChatMessage
from router.errors import invalid
from router.flow.types import sampling_params

TokenId = Annotated[int, Field(ge=0, lt=1 << 32)]
TokenCount = Annotated[int, Field(ge=1, lt=1 << 32)]
MAX_SEED = (1 << 64) - 1
COMPLETION_MAX_TOKENS = 16
"""A completion's length when the request sets none (OpenAI's default)."""
MAX_N = 16
"""The most samples one request may ask for (``n``): each is a request on the workers."""
LogprobCount = Annotated[int, Field(ge=0, le=MAX_LOGPROBS)]

RETURN_TOKEN_IDS = (
    "vLLM's extension: if true, each choice carries token_ids, the generated ids exactly as "
    "sampled (streamed: each chunk's own), and the answer carries prompt_token_ids, the "
    "prompt's ids as tokenized: on the choice for a completion, on the response for a chat "
    "(streamed: on the first chunk)"
)
"""The OpenAPI description of ``return_token_ids`` (:class:`router.api.responses.Formatter`)."""

TokenBiases = dict[str, float]
_TOKEN_KEY = re.compile(r"[0-9]{1,20}")
"""A ``logit_bias`` key: a token id in decimal (ids past the wire's range are refused with
the others out of range)."""


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    include_usage: bool = False


class SamplingFields(BaseModel):
    """Fields shared by completions and chat completions."""

    model_config = ConfigDict(extra="allow", strict=True)  # extras: see _check_refused

    model: str
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=-1, lt=1 << 32)] | None = None  # extension; -1, 0 = off
    ignore_eos: bool = False  # extension (as vLLM's): generate max_tokens whatever comes
    seed: Annotated[int, Field(ge=0, le=MAX_SEED)] | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Annotated[int, Field(ge=1, le=MAX_N)] = 1
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: TokenBiases | None = None
    """Token id (a decimal string, as JSON keys are) -> value added to its logit."""
    repetition_penalty: float | None = None  # extension (vLLM's); 1 = off
    min_tokens: Annotated[int, Field(ge=0, lt=1 << 32)] | None = None  # extension (vLLM's)
    stop_token_ids: list[TokenId] | None = None  # extension (vLLM's)
    cache_salt: Annotated[str, Field(max_length=MAX_CACHE_SALT_CHARS)] | None = None
    """Extension, as vLLM's: requests with different salts share no cached prefix."""
    return_token_ids: bool | None = Field(None, description=RETURN_TOKEN_IDS)
    """Extension (vLLM's): the answer carries the prompt's and the output's token ids."""

    refused: ClassVar[Mapping[str, Off]] = REFUSED
    """:data:`REFUSED`, with this route's ``add_special_tokens`` default."""

    @property
    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def output_limit(self) -> int | None:
        """The requested completion length, if the request sets one."""
        return None

    @property
    def logit_bias_ids(self) -> dict[int, float]:
        """``logit_bias`` keyed by token id (400 for a key that is not a decimal id; the
        count is checked before the keys are read). Ranges are checked by
        :meth:`check_sampling`."""
        bias = self.logit_bias or {}
        if error := logit_bias_count_error(len(bias)):
            raise invalid(error, "logit_bias", "invalid_value")
        for key in bias:
            if not _TOKEN_KEY.fullmatch(key):
                raise invalid(
                    f"logit_bias keys must be token ids (decimal integers), got {key[:32]!r}",
                    "logit_bias",
                    "invalid_value",
                )
        return {int(key): value for key, value in bias.items()}

    def wire_params(self, max_tokens: int) -> pb.SamplingParams:
        """The worker's sampling params of this (checked) request, producing at most
        ``max_tokens`` tokens; unset fields take their defaults."""
        return sampling_params(
            max_tokens=max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=self.top_k or 0,
            seed=self.seed,
            stop=self.stop_list,
            ignore_eos=self.ignore_eos,
            stop_token_ids=self.stop_token_ids or (),
            logit_bias=self.logit_bias_ids,
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            repetition_penalty=self._repetition_penalty,
            min_tokens=self.min_tokens or 0,
            logprobs=self.sample_logprobs,
            prompt_logprobs=self.prompt_logprobs,
        )

    @property
    def sample_logprobs(self) -> int | None:
        """Alternatives per output token's logprob (None: no logprobs)."""
        return None

    @property
    def prompt_logprobs(self) -> int | None:
        """Alternatives per prompt token's logprob (None: none)."""
        return None

    @property
    def _repetition_penalty(self) -> float:
        return 1.0 if self.repetition_penalty is None else self.repetition_penalty

    def _check_refused(self) -> None:
        """400 for the first field of :attr:`refused` that is set and not off."""
        for name, value in (self.model_extra or {}).items():
            off = self.refused.get(name)
            if off is None or value is None or is_off(value, off):
                continue
            allowed = " or ".join(json.dumps(o) for o in off)
            only = f" (only {allowed})" if allowed else ""
            raise invalid(f"{name} is not supported{only}", name, "unsupported_value")

    def check_sampling(self) -> None:
        self._check_refused()
        if error := stop_error(self.stop_list):
            raise invalid(error, "stop", "invalid_value")
        if error := stop_token_ids_count_error(len(self.stop_token_ids or ())):
            raise invalid(error, "stop_token_ids", "invalid_value")
        if refused := logits_processing_error(
            logit_bias=self.logit_bias_ids,
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            repetition_penalty=self._repetition_penalty,
            min_tokens=self.min_tokens or 0,
            max_tokens=self.output_limit,
        ):
            raise invalid(refused[1], refused[0], "invalid_value")
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
    max_tokens: TokenCount | None = COMPLETION_MAX_TOKENS
    logprobs: LogprobCount | None = None
    """The logprob of each output token and this many most likely alternatives."""
    echo: bool = False
    """The answer's text starts with the prompt's; with ``logprobs``, so do its logprobs."""

    refused = {**REFUSED, "add_special_tokens": (True,)}  # the prompt's text gets them

    def check(self) -> None:
        self.check_sampling()
        self.prompt_input()

    @property
    def output_limit(self) -> int:
        return COMPLETION_MAX_TOKENS if self.max_tokens is None else self.max_tokens

    @property
    def sample_logprobs(self) -> int | None:
        return self.logprobs

    @property
    def prompt_logprobs(self) -> int | None:
        return self.logprobs if self.echo else None

    @property
    def prompt_text(self) -> str | None:
        """The prompt as the client wrote it, when it sent text (for ``echo``)."""
        p = self.prompt
        if isinstance(p, str):
            return p
        return p[0] if p and isinstance(p[0], str) else None

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


class ChatCompletionRequest(SamplingFields):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage]
    max_tokens: TokenCount | None = None
    max_completion_tokens: TokenCount | None = None
    logprobs: bool = False
    """Each output token's logprob, with ``top_logprobs`` most likely alternatives."""
    top_logprobs: LogprobCount | None = None

    refused = {**REFUSED, "add_special_tokens": (False,)}  # the template places them

    def check(self) -> None:
        self.check_sampling()
        if not self.messages:
            raise invalid("messages must not be empty", "messages", "invalid_value")
        if self.top_logprobs is not None and not self.logprobs:
            raise invalid("logprobs must be set to true if top_logprobs is used", "top_logprobs")

    @property
    def sample_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def output_limit(self) -> int | None:
        """The requested completion length (``max_completion_tokens`` wins), if any."""
        return self.max_completion_tokens or self.max_tokens

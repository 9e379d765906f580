"""The bodies of ``POST /tokenize`` and ``POST /detokenize`` (vLLM's shapes;
:mod:`router.api.routes.tokens`)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from router.api.openai_messages import ChatMessage
from router.api.openai_models import TokenId

MAX_DETOKENIZE = 1 << 20
"""The most token ids one ``/detokenize`` takes (a body cap bounds them before)."""


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    model: str
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    model: str
    tokens: Annotated[list[TokenId], Field(max_length=MAX_DETOKENIZE)]

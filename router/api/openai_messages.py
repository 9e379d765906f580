"""A chat completion's messages, as the router accepts them (text only)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict


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

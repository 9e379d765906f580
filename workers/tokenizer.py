"""Text in and out: the model directory's tokenizer and chat template.

Wraps the Hugging Face tokenizer (:func:`proto.tokenization.load_tokenizer`, as the router
loads it), so any supported model directory brings its own vocabulary, special tokens and
chat template.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from proto.tokenization import load_tokenizer


class Tokenizer:
    def __init__(self, model_dir: Path) -> None:
        self._tok: Any = load_tokenizer(model_dir)

    @property
    def eos_token_id(self) -> int | None:
        value = self._tok.eos_token_id
        return None if value is None else int(value)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=True))

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return str(self._tok.decode(token_ids, skip_special_tokens=skip_special_tokens))

    def apply_chat_template(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of ``messages`` rendered with the model's template, ready to answer."""
        if not self._tok.chat_template:
            raise ValueError("this model has no chat template; use a plain completion")
        out = self._tok.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        if isinstance(out, dict) or hasattr(out, "keys"):
            out = out["input_ids"]
        return [int(t) for t in out]

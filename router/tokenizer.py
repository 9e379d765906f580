"""Prompts to token ids: the served model's tokenizer and chat template, read locally.

The router tokenizes so that it can check lengths, look prompts up in the pool and hand
workers token ids. The directory is a Hugging Face model directory on this machine
(``tokenizer.json``, ``tokenizer_config.json``, a chat template); nothing is fetched.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


class PromptTokenizer:
    def __init__(self, model_dir: Path) -> None:
        from transformers import AutoTokenizer

        if not (model_dir / "tokenizer.json").is_file():
            raise FileNotFoundError(f"no tokenizer.json in {model_dir}")
        self.model_dir = model_dir
        self._tok: Any = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
        self.vocab_size = len(self._tok)

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self._tok.encode(text, add_special_tokens=True)]

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of ``messages`` under the model's chat template, ready for the answer."""
        if not self._tok.chat_template:
            raise ValueError("this model has no chat template; use /v1/completions")
        out = self._tok.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        if isinstance(out, dict) or hasattr(out, "keys"):
            out = out["input_ids"]
        return [int(t) for t in out]

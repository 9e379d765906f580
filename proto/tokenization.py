"""The model's tokenizer: the one wrapper the router and every worker use.

Why in ``proto``: the router's token ids are the ids the workers compute and detokenize, so
the tokenizer (loaded the same way, from the same kind of directory) is part of the contract
between them, and ``proto`` is the package that holds that contract and that both sides may
import (``tests/unit/test_import_rules.py``). A package of its own would add an import rule
for one module and nothing else. What only one side needs stays on that side: the router's
threads and background load (:mod:`router.flow.tokenizer`), the workers' released text and stop
strings (:mod:`workers.core.detokenizer`).

A model directory on this machine with a ``tokenizer.json``; nothing is fetched. Loaded
through transformers' ``PreTrainedTokenizerFast`` (the ``tokenizers`` backend, the class
``AutoTokenizer`` itself picks for such a directory), which imports in about 2 s and
without torch; ``AutoTokenizer``, which imports torch and its model registry (5 s or more
here), only when ``tokenizer_config.json`` names another tokenizer class.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as Backend
from tokenizers.decoders import DecodeStream

FAST_CLASSES = ("", "TokenizersBackend", "PreTrainedTokenizerFast")
"""``tokenizer_class`` values that ``PreTrainedTokenizerFast`` loads as ``AutoTokenizer``
would (empty: the config names none)."""
INVALID_PREFIX = "Invalid prefix"
"""How ``DecodeStream.step``'s error starts when a token changed text it already yielded."""


def tokenizer_class(model_dir: Path) -> str:
    """The ``tokenizer_class`` that ``model_dir``'s ``tokenizer_config.json`` names, or ``""``."""
    config = model_dir / "tokenizer_config.json"
    if not config.is_file():
        return ""
    value = json.loads(config.read_text()).get("tokenizer_class") or ""
    return str(value)


def load_tokenizer(model_dir: Path) -> Any:
    """The Hugging Face tokenizer of ``model_dir`` (FileNotFoundError without a
    ``tokenizer.json``)."""
    if not (model_dir / "tokenizer.json").is_file():
        raise FileNotFoundError(f"no tokenizer.json in {model_dir}")
    if tokenizer_class(model_dir) in FAST_CLASSES:
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(str(model_dir), local_files_only=True)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)


class Tokenizer:
    """Text to token ids and back, with the model directory's vocabulary, special tokens and
    chat template (:func:`load_tokenizer`). Thread-safe for concurrent calls (the router
    encodes in several threads)."""

    def __init__(self, model_dir: Path) -> None:
        self.model_dir = model_dir
        self._tok: Any = load_tokenizer(model_dir)
        backend = getattr(self._tok, "backend_tokenizer", None)
        self.backend: Backend = (
            backend
            if isinstance(backend, Backend)
            else Backend.from_file(str(model_dir / "tokenizer.json"))
        )
        """The ``tokenizers`` tokenizer that :meth:`stream` decodes with: the loaded class's
        own, or (a class without one) ``tokenizer.json`` read directly."""
        self.vocab_size = len(self._tok)
        """Token ids below it are the vocabulary's (added tokens included)."""

    @property
    def eos_token_id(self) -> int | None:
        value = self._tok.eos_token_id
        return None if value is None else int(value)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """``text``'s token ids, with the special tokens the tokenizer adds (e.g. BOS)
        unless ``add_special_tokens`` is false."""
        return [int(t) for t in self._tok.encode(text, add_special_tokens=add_special_tokens)]

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of ``messages`` under the model's chat template, ready for the answer;
        ValueError when the model has no template (or the template refuses them)."""
        if not self._tok.chat_template:
            raise ValueError("this model has no chat template; use /v1/completions")
        out = self._tok.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        if isinstance(out, dict) or hasattr(out, "keys"):
            out = out["input_ids"]
        return [int(t) for t in out]

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        """The text of ``token_ids`` at once (the reference :meth:`stream` is checked against)."""
        return str(self._tok.decode(token_ids, skip_special_tokens=skip_special_tokens))

    def token_texts(self, token_ids: Sequence[int]) -> list[str]:
        """Each id's own text (decoded alone, special tokens kept: a piece of a multi-byte
        character shows as U+FFFD, as in vLLM's logprobs)."""
        return [str(t) for t in self._tok.batch_decode([[i] for i in token_ids])]

    def stream(self, skip_special_tokens: bool = True) -> TextStream:
        """A new :class:`TextStream` for one sequence's tokens."""
        return TextStream(self.backend, skip_special_tokens)


class TextStream:
    """One token sequence's text, a piece per token: ``tokenizers``' ``DecodeStream``.

    Contract:

    - :meth:`step` returns the text the token completes: ``""`` while the text ends in an
      incomplete character (a multi-byte character split over byte or byte-fallback tokens)
      or the token adds none (a skipped special token); the pieces are never taken back;
    - the pieces joined are the decoder's text of the tokens up to the last one that
      completes a character: for text that is valid UTF-8 the same as
      :meth:`Tokenizer.decode` of those tokens without transformers'
      ``clean_up_tokenization_spaces``;
    - the same tokens give the same pieces (each token's piece depends only on the tokens
      before it), so two streams fed the same tokens agree;
    - work per token: one decode of a window of the last few tokens in Rust, a second when
      the token yields text; a long answer costs O(n), not O(n^2).

    When a token changes text already yielded (possible only with invalid UTF-8 from
    byte-fallback tokens: the decoder then replaces a whole run of bytes),
    ``DecodeStream`` refuses it ("Invalid prefix"); the stream then starts over at that
    token, as vLLM's does: the earlier pieces stand and the text goes on from there.
    """

    def __init__(self, backend: Backend, skip_special_tokens: bool = True) -> None:
        self.backend = backend
        self.skip_special_tokens = skip_special_tokens
        self._stream = DecodeStream(skip_special_tokens=skip_special_tokens)

    def step(self, token_id: int) -> str:
        """Add ``token_id``; the text it completes (may be empty)."""
        try:
            piece = self._stream.step(self.backend, token_id)
        except Exception as exc:
            if not str(exc).startswith(INVALID_PREFIX):
                raise
            self._stream = DecodeStream(skip_special_tokens=self.skip_special_tokens)
            piece = self._stream.step(self.backend, token_id)
        return piece or ""

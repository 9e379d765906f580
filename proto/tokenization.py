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
here), only when ``tokenizer_config.json`` names another tokenizer class. A worker only
streams text and stops at the end-of-sequence token: it reads those two from the files
(:func:`plain_parts`, 0.1 s of CPU against 0.9 s with transformers) where that gives what
transformers would, and loads transformers only if something else is asked of it.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as Backend
from tokenizers.decoders import DecodeStream

FAST_CLASSES = ("", "TokenizersBackend", "PreTrainedTokenizerFast")
"""``tokenizer_class`` values that ``PreTrainedTokenizerFast`` loads as ``AutoTokenizer``
would (empty: the config names none)."""
PLAIN_CONFIG = frozenset(
    {
        "backend", "tokenizer_class", "bos_token", "eos_token", "pad_token", "unk_token",
        "is_local", "local_files_only", "model_max_length", "clean_up_tokenization_spaces",
        "chat_template", "model_input_names", "padding_side", "truncation_side",
    }
)  # fmt: skip
"""``tokenizer_config.json`` keys under which transformers leaves ``tokenizer.json``'s
tokenizer as it is (once the special tokens are the vocabulary's own, :func:`plain_parts`);
any other key (``added_tokens_decoder``, ``add_bos_token``, ``add_prefix_space``...) may
change it, and transformers is then asked."""
SPECIAL_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token")
INVALID_PREFIX = "Invalid prefix"
"""How ``DecodeStream.step``'s error starts when a token changed text it already yielded."""


def tokenizer_config(model_dir: Path) -> dict[str, Any]:
    """``model_dir``'s ``tokenizer_config.json``, or ``{}`` without one."""
    path = model_dir / "tokenizer_config.json"
    if not path.is_file():
        return {}
    config = json.loads(path.read_text())
    return config if isinstance(config, dict) else {}


def tokenizer_class(model_dir: Path) -> str:
    """The ``tokenizer_class`` that ``model_dir``'s ``tokenizer_config.json`` names, or ``""``."""
    return _class_named(tokenizer_config(model_dir))


def _class_named(config: dict[str, Any]) -> str:
    """The ``tokenizer_class`` a ``tokenizer_config.json`` names, or ``""``."""
    return str(config.get("tokenizer_class") or "")


def plain_parts(model_dir: Path) -> tuple[Backend, int] | None:
    """``tokenizer.json``'s tokenizer and the end-of-sequence id, read without transformers,
    when they are what transformers loads: a fast tokenizer class, no
    ``special_tokens_map.json``, only :data:`PLAIN_CONFIG` keys, and every special token it
    names (a string, or ``{"content": ...}``) one of the tokenizer's added special tokens, the
    end-of-sequence one among them. ``None`` otherwise: ask transformers. FileNotFoundError
    without a ``tokenizer.json``."""
    if not (model_dir / "tokenizer.json").is_file():
        raise FileNotFoundError(f"no tokenizer.json in {model_dir}")
    config = tokenizer_config(model_dir)
    plain = set(config) <= PLAIN_CONFIG and _class_named(config) in FAST_CLASSES
    if not plain or (model_dir / "special_tokens_map.json").exists():
        return None
    backend = Backend.from_file(str(model_dir / "tokenizer.json"))
    special = {t.content: i for i, t in backend.get_added_tokens_decoder().items() if t.special}
    named = {key: _content(config[key]) for key in SPECIAL_KEYS if config.get(key) is not None}
    if "eos_token" not in named or not all(n in special for n in named.values()):
        return None
    return backend, special[str(named["eos_token"])]


def _content(token: Any) -> str | None:
    """A special token's text as ``tokenizer_config.json`` writes it (a string, or an added
    token's ``{"content": ...}``); None for anything else."""
    value = token.get("content") if isinstance(token, dict) else token
    return value if isinstance(value, str) else None


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
    encodes in several threads).

    ``lazy`` (a worker's): :attr:`backend` and :attr:`eos_token_id` from the files where
    :func:`plain_parts` has them, transformers' tokenizer loaded (once, under a lock) on the
    first call that needs it; the answers are the same either way."""

    def __init__(self, model_dir: Path, *, lazy: bool = False) -> None:
        self.model_dir = model_dir
        self._lock = threading.Lock()
        self._loaded: Any = None
        self.backend, self.eos_token_id = (plain_parts(model_dir) if lazy else None) or (
            self._loaded_parts()
        )
        """``backend``: the ``tokenizers`` tokenizer that :meth:`stream` decodes with (the
        loaded class's own, or ``tokenizer.json`` read directly: read plainly, or a class
        without one); ``eos_token_id``: the end-of-sequence id, or None."""

    @property
    def _tok(self) -> Any:
        """Transformers' tokenizer (:func:`load_tokenizer`), loaded on first use."""
        with self._lock:
            if self._loaded is None:
                self._loaded = load_tokenizer(self.model_dir)
            return self._loaded

    def _loaded_parts(self) -> tuple[Backend, int | None]:
        """The backend and end-of-sequence id of transformers' tokenizer."""
        backend = getattr(self._tok, "backend_tokenizer", None)
        if not isinstance(backend, Backend):  # a class without one
            backend = Backend.from_file(str(self.model_dir / "tokenizer.json"))
        eos = self._tok.eos_token_id
        return backend, None if eos is None else int(eos)

    @functools.cached_property
    def vocab_size(self) -> int:
        """Token ids below it are the vocabulary's (added tokens included)."""
        return len(self._tok)

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

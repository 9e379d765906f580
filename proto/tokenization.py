"""The tokenizer of a model directory, loaded the one way the router and every worker load
it (the router's token ids are the ids the workers compute and detokenize: part of the
contract between them).

A model directory on this machine with a ``tokenizer.json``; nothing is fetched. Loaded
through transformers' ``PreTrainedTokenizerFast`` (the ``tokenizers`` backend, the class
``AutoTokenizer`` itself picks for such a directory), which imports in about 2 s and
without torch; ``AutoTokenizer``, which imports torch and its model registry (5 s or more
here), only when ``tokenizer_config.json`` names another tokenizer class.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FAST_CLASSES = ("", "TokenizersBackend", "PreTrainedTokenizerFast")
"""``tokenizer_class`` values that ``PreTrainedTokenizerFast`` loads as ``AutoTokenizer``
would (empty: the config names none)."""


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

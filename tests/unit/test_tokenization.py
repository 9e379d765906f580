"""The shared tokenizer (:mod:`proto.tokenization`): its text streams against decoding at
once, with the project's tokenizer (SmolLM2's byte-level BPE, which the tiny test models
copy) and with a byte-fallback vocabulary built here (as Llama's and Mistral's); a worker's
tokenizer read from the files (``lazy``) against transformers', and the configurations
where it asks transformers instead."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as Backend

import proto.tokenization as tokenization
from proto.tokenization import TextStream, Tokenizer, plain_parts

TEXT = "Hello wörld! 😀 €uro, naïve café, 日本語のテキスト 👍🏽 done."
"""Characters of two, three and four bytes, some split over several tokens."""


def pieces(stream: TextStream, token_ids: list[int]) -> list[str]:
    return [stream.step(token) for token in token_ids]


@pytest.fixture(scope="module")
def smollm2(default_model_dir: Path) -> Tokenizer:
    return Tokenizer(default_model_dir)


def test_a_stream_yields_the_text_decoded_at_once(smollm2: Tokenizer) -> None:
    ids = smollm2.encode(TEXT)
    out = pieces(smollm2.stream(), ids)
    assert "".join(out) == smollm2.decode(ids) == TEXT
    assert "" in out  # a character split over tokens waits for its last byte
    assert all("\ufffd" not in piece for piece in out)


def test_special_tokens_add_no_text(smollm2: Tokenizer) -> None:
    eos = smollm2.eos_token_id
    assert eos is not None
    ids = [*smollm2.encode("Hi"), eos, *smollm2.encode(" there")]
    assert pieces(smollm2.stream(), ids) == ["Hi", "", " there"]
    assert "".join(pieces(smollm2.stream(False), ids)) == smollm2.decode(ids, False)


def test_the_chat_template_renders_the_model_format(smollm2: Tokenizer, tmp_path: Path) -> None:
    ids = smollm2.encode_chat([{"role": "user", "content": "Hi"}])
    text = smollm2.decode(ids, skip_special_tokens=False)
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(smollm2.model_dir / name, tmp_path / name)
    with pytest.raises(ValueError, match="no chat template"):
        Tokenizer(tmp_path).encode_chat([{"role": "user", "content": "Hi"}])


def test_a_class_without_a_backend_streams_with_tokenizer_json(
    smollm2: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Bare:
        """A tokenizer class without ``backend_tokenizer`` (a Python one)."""

        eos_token_id = None

        def __len__(self) -> int:
            return 3

    def bare(model_dir: Path) -> Any:
        return Bare()

    monkeypatch.setattr(tokenization, "load_tokenizer", bare)
    tok = Tokenizer(smollm2.model_dir)
    ids = smollm2.encode(TEXT)
    assert "".join(pieces(tok.stream(), ids)) == TEXT


def test_a_lazy_tokenizer_reads_what_transformers_loads(smollm2: Tokenizer) -> None:
    """The project's tokenizer is read from its files: the same backend and EOS as
    transformers', and transformers' own answers once something else is asked."""
    lazy = Tokenizer(smollm2.model_dir, lazy=True)
    assert plain_parts(smollm2.model_dir) is not None
    assert lazy.eos_token_id == smollm2.eos_token_id is not None
    assert lazy.backend.to_str() == smollm2.backend.to_str()
    ids = smollm2.encode(TEXT)
    assert pieces(lazy.stream(), ids) == pieces(smollm2.stream(), ids)
    assert lazy.encode(TEXT) == ids and lazy.decode(ids) == TEXT
    assert lazy.vocab_size == smollm2.vocab_size


def config_with(folder: Path, source: Path, **changes: Any) -> Path:
    """``source``'s tokenizer files in ``folder``, its ``tokenizer_config.json`` with
    ``changes`` (a None value removes the key)."""
    shutil.copy(source / "tokenizer.json", folder / "tokenizer.json")
    config = json.loads((source / "tokenizer_config.json").read_text())
    config.update(changes)
    kept = {key: value for key, value in config.items() if value is not None}
    (folder / "tokenizer_config.json").write_text(json.dumps(kept))
    return folder


@pytest.mark.parametrize(
    "changes",
    [
        {"add_bos_token": True},  # a key that may change the tokenizer
        {"eos_token": "hello"},  # not an added special token
        {"eos_token": None},
        {"pad_token": "<pad>"},  # transformers would add it
        {"tokenizer_class": "LlamaTokenizer"},
    ],
)
def test_transformers_is_asked_where_the_files_may_not_say_it_all(
    smollm2: Tokenizer, tmp_path: Path, changes: dict[str, Any]
) -> None:
    assert plain_parts(config_with(tmp_path, smollm2.model_dir, **changes)) is None


def test_a_special_tokens_map_or_an_added_token_form(smollm2: Tokenizer, tmp_path: Path) -> None:
    folder = config_with(tmp_path, smollm2.model_dir, eos_token={"content": "<|im_end|>"})
    parts = plain_parts(folder)
    assert parts is not None and parts[1] == smollm2.eos_token_id
    (folder / "special_tokens_map.json").write_text("{}")
    assert plain_parts(folder) is None
    with pytest.raises(FileNotFoundError):
        plain_parts(tmp_path / "nowhere")


def byte_fallback() -> Backend:
    """A Llama-style vocabulary: a few words, every byte as ``<0xNN>``, ``▁`` for spaces."""
    words = ["▁", "a", "b", "▁a", "▁b", "ab", "▁ab", "é", "▁é", "x"]
    names = ["<unk>", *(f"<0x{b:02X}>" for b in range(256)), *words]
    vocab = {name: i for i, name in enumerate(names)}
    tok = Backend(models.BPE(vocab, [], unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace("▁", prepend_scheme="first")
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    tok.add_special_tokens([AddedToken("</s>", special=True)])
    return tok


@pytest.mark.parametrize("text", [TEXT, "a b ab é€ x😀 日", "€€", " é😀ab"])
def test_byte_fallback_characters_wait_for_their_last_byte(text: str) -> None:
    tok = byte_fallback()
    ids = tok.encode(text).ids
    out = pieces(TextStream(tok), ids)
    assert "".join(out) == tok.decode(ids) and "\ufffd" not in "".join(out)
    assert len(ids) > len(text.replace(" ", "")) - 1  # bytes, not characters


def test_a_token_that_rewrites_yielded_text_restarts_the_stream() -> None:
    """Invalid UTF-8: the bytes C3 82 yield ``Â``; another 82 and a word make the decoder
    replace the whole run (``���``), which ``DecodeStream`` refuses. The stream goes on from
    that token, the same way for every stream fed the same tokens."""
    tok = byte_fallback()
    names = ["<0xC3>", "<0x82>", "<0x82>", "▁é", "▁a"]
    ids = [tok.token_to_id(name) for name in names]
    assert None not in ids
    known = [int(i) for i in ids if i is not None]
    out = pieces(TextStream(tok), known)
    assert out == ["", "Â", "", "é", " a"]
    assert pieces(TextStream(tok), known) == out

"""Stop strings in :class:`workers.core.detokenizer.IncrementalText`: what is released when, where
the text is cut, that a token's search covers only the window a match can end in, and that
pushing tokens together releases what pushing them one at a time does.

Tokens here are byte strings in a real ``tokenizers`` vocabulary with the byte-level
decoder (a character may be split over tokens, as with byte-level BPE), streamed by
:class:`proto.tokenization.TextStream`; :class:`WholeText` is the reference: after every
token it decodes all tokens in Python and searches the whole text.
"""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, decoders, models
from tokenizers import Tokenizer as Backend

import workers.core.detokenizer as detok
from proto.limits import MAX_STOP_STRING_CHARS
from proto.tokenization import TextStream
from workers.core.detokenizer import IncrementalText, find_stop

INCOMPLETE = "\ufffd"


def byte_chars() -> dict[int, str]:
    """GPT-2's byte -> character table, which the byte-level decoder reads tokens with."""
    printable = {*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    extra = iter(range(256, 512))
    return {b: chr(b) if b in printable else chr(next(extra)) for b in range(256)}


CHARS = byte_chars()


class ByteDecoder:
    """A byte-level vocabulary grown on demand: token ``i`` is the bytes ``vocab[i]``."""

    def __init__(self) -> None:
        self.backend = Backend(models.WordLevel({"<unk>": 0}, unk_token="<unk>"))
        self.backend.decoder = decoders.ByteLevel()
        self.vocab: dict[int, bytes] = {}

    def tokens(self, pieces: list[bytes]) -> list[int]:
        """Ids for ``pieces`` (new tokens, or the ids of pieces seen before)."""
        names = ["".join(CHARS[b] for b in piece) for piece in pieces]
        self.backend.add_tokens([AddedToken(name, normalized=False) for name in names])
        ids = [self.backend.token_to_id(name) for name in names]
        found = [i for i in ids if i is not None]
        assert len(found) == len(ids)
        self.vocab.update(zip(found, pieces, strict=True))
        return found

    def stream(self) -> TextStream:
        return TextStream(self.backend)

    def decode(self, token_ids: list[int]) -> str:
        """The reference: invalid UTF-8 decodes to U+FFFD, as Hugging Face tokenizers do."""
        return b"".join(self.vocab[i] for i in token_ids).decode("utf-8", errors="replace")


class WholeText:
    """Reference: after each token, the text of all tokens up to the last one that completes
    a character, searched whole for every stop string."""

    def __init__(self, decoder: ByteDecoder, stop: tuple[str, ...]) -> None:
        self.decoder = decoder
        self.stop = stop
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.token_ids: list[int] = []
        self.text = ""
        self.released = 0
        self.stopped = False

    def push(self, token_ids: list[int]) -> str:
        for token in token_ids:
            if self.stopped:
                break
            self.token_ids.append(token)
            full = self.decoder.decode(self.token_ids)
            if not full.endswith(INCOMPLETE):
                self.text = full
            hits = [i for i in (self.text.find(s) for s in self.stop) if i >= 0]
            if hits:
                self.text = self.text[: min(hits)]
                self.stopped = True
        return self.release(final=self.stopped)

    def release(self, final: bool) -> str:
        end = len(self.text) if final else max(self.released, len(self.text) - self.hold)
        out = self.text[self.released : end]
        self.released = end
        return out


def run(pieces: list[str | bytes], stop: tuple[str, ...]) -> tuple[list[str], IncrementalText]:
    """Push each piece as one token; the released text of each push, then of ``finish``."""
    decoder = ByteDecoder()
    text = IncrementalText(decoder.stream(), stop)
    raw = [p.encode() if isinstance(p, str) else p for p in pieces]
    deltas = [text.push([token]) for token in decoder.tokens(raw)]
    return [*deltas, text.finish()], text


def test_a_stop_string_split_over_many_tokens() -> None:
    deltas, text = run(["ab", "S", "T", "O", "P", "z"], ("STOP",))
    assert deltas == ["", "", "a", "b", "", "", ""]
    assert text.text == "ab" and text.stopped


def test_a_broken_stop_string_start_is_released_when_it_cannot_match() -> None:
    deltas, text = run(["S", "T", "O", "x", "y"], ("STOP",))
    assert deltas == ["", "", "", "S", "T", "Oxy"]
    assert text.text == "STOxy" and not text.stopped


def test_the_first_stop_string_to_complete_wins() -> None:
    """One character at a time, ``bcd`` completes before ``abcde``; in one token both are
    complete and the one starting first wins."""
    stop = ("abcde", "bcd")
    deltas, text = run(list("xabcdef"), stop)
    assert "".join(deltas) == text.text == "xa"
    _, whole = run(["xabcdef"], stop)
    assert whole.text == "x"


def test_overlapping_stop_strings_cut_at_the_leftmost() -> None:
    """Both complete in the same token: the one starting first wins, also when it started
    in text held back by an earlier push."""
    assert run(["12", "xabcd"], ("bc", "abcd"))[0] == ["", "12x", ""]
    deltas, text = run(["12a", "bcd"], ("bc", "abcd"))
    assert deltas == ["", "12", ""] and text.text == "12"


def test_a_stop_string_at_the_very_start() -> None:
    assert run(["<e", "nd>", "more"], ("<end>",))[0] == ["", "", "", ""]
    deltas, text = run(["<end>tail"], ("<end>",))
    assert deltas == ["", ""] and text.text == "" and text.stopped


def test_the_text_after_a_stop_is_not_searched_again() -> None:
    """Once cut, a second occurrence (in the same token or later ones) changes nothing."""
    deltas, text = run(["aXbX", "X", "cX"], ("X",))
    assert deltas == ["a", "", "", ""] and text.text == "a"


def test_an_earlier_occurrence_is_not_reported() -> None:
    """Only matches ending at or after ``new_from`` count: text before it was searched."""
    assert find_stop("xSTOPyySTOP", ("STOP",), 7) == 7
    assert find_stop("xSTOPyySTOP", ("STOP",), 8) == 7
    assert find_stop("xSTOPyy", ("STOP",), 5) == -1
    assert find_stop("STOP", ("STOP",), 0) == 0


def test_multi_byte_characters_are_held_until_complete() -> None:
    euro = "€".encode()
    assert run([euro[:1], euro[1:2], euro[2:] + b"!"], ())[0] == ["", "", "€!", ""]
    deltas, text = run([b"a" + euro[:2], euro[2:], b"b"], ("€",))
    assert deltas == ["", "a", "", ""] and text.text == "a" and text.stopped


def test_without_stop_strings_everything_is_released_at_once() -> None:
    assert run(["a", "bc", "d"], ())[0] == ["a", "bc", "d", ""]


def test_finish_releases_the_held_back_tail_and_ends_the_text() -> None:
    decoder = ByteDecoder()
    text = IncrementalText(decoder.stream(), ("STOP",))
    a, b = decoder.tokens([b"xxST", b"more"])
    assert text.push([a]) == "x"
    assert text.finish() == "xST"
    assert text.push([b]) == ""
    assert text.text == "xxST" and text.released == 4


ALPHABET = "ab\n€😀"
"""Few characters, so that stop strings occur; two of them are multi-byte."""


@st.composite
def streams(draw: st.DrawFn) -> tuple[list[list[bytes]], tuple[str, ...]]:
    """A random text cut into byte tokens anywhere (also inside a character), the tokens
    grouped into pushes, and up to four stop strings."""
    data = draw(st.text(ALPHABET, max_size=40)).encode()
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(data) - 1)), max_size=len(data))))
    bounds = [0, *(c for c in cuts if c < len(data)), len(data)]
    tokens = [data[i:j] for i, j in pairwise(bounds) if j > i]
    pushes: list[list[bytes]] = []
    while tokens:
        n = draw(st.integers(1, 3))
        pushes.append(tokens[:n])
        tokens = tokens[n:]
    stop = draw(st.lists(st.text(ALPHABET, min_size=1, max_size=5), max_size=4))
    return pushes, tuple(stop)


@settings(max_examples=400, deadline=None)
@given(streams())
def test_matches_a_search_over_the_whole_text(
    case: tuple[list[list[bytes]], tuple[str, ...]],
) -> None:
    pushes, stop = case
    decoder = ByteDecoder()
    ours, ref = IncrementalText(decoder.stream(), stop), WholeText(decoder, stop)
    for group in pushes:
        ids = decoder.tokens(group)
        assert ours.push(ids) == ref.push(ids)
        assert ours.stopped == ref.stopped
    assert ours.finish() == ref.release(final=True)
    assert ours.text == ref.text and ours.released == len(ref.text)


def test_tokens_pushed_together_release_what_they_released_one_by_one() -> None:
    """A resumed request: one worker streamed the tokens, the next pushes them at once (they
    end inside a character) and goes on; the text it releases then is the rest, not again
    what the first worker released before the split character."""
    euro = "€".encode()
    decoder = ByteDecoder()
    ids = decoder.tokens([b"ab", euro[:1], euro[1:2], euro[2:] + b"c", b"d"])
    first, resumed = IncrementalText(decoder.stream()), IncrementalText(decoder.stream())
    streamed = [first.push([token]) for token in ids]
    assert streamed == ["ab", "", "", "€c", "d"]
    assert resumed.push(ids[:2]) == "ab" and resumed.released == first.released - 3
    assert [resumed.push([token]) for token in ids[2:]] == streamed[2:]
    assert resumed.text == first.text == "ab€cd"


@settings(max_examples=200, deadline=None)
@given(streams(), st.integers(0, 3), st.data())
def test_a_resumed_request_releases_the_rest_of_the_text(
    case: tuple[list[list[bytes]], tuple[str, ...]], min_tokens: int, data: st.DataObject
) -> None:
    """Any tokens pushed at once, then one at a time, release what pushing all of them one
    at a time releases from there on, with and without ``min_tokens``."""
    pushes, stop = case
    decoder = ByteDecoder()
    ids = decoder.tokens([token for group in pushes for token in group])
    split = data.draw(st.integers(0, len(ids)))
    first = IncrementalText(decoder.stream(), stop, min_tokens)
    resumed = IncrementalText(decoder.stream(), stop, min_tokens)
    streamed = [first.push([token]) for token in ids]
    assert resumed.push(ids[:split]) == "".join(streamed[:split])
    assert [resumed.push([token]) for token in ids[split:]] == streamed[split:]
    assert resumed.finish() == first.finish() and resumed.stopped == first.stopped


def test_a_tokens_search_is_bounded_by_its_text_and_the_longest_stop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With stop strings as long as allowed, a long answer's searches each look at the new
    text plus fewer than the longest stop string's characters before it, however long the
    text already is."""
    windows: list[tuple[int, int]] = []

    def spy(text: str, stop: tuple[str, ...], new_from: int) -> int:
        windows.append((len(text), new_from))
        return find_stop(text, stop, new_from)

    monkeypatch.setattr(detok, "find_stop", spy)
    longest = MAX_STOP_STRING_CHARS
    stop = ("z" * longest, "y" * (longest - 1) + "q", "short")
    decoder = ByteDecoder()
    text = IncrementalText(decoder.stream(), stop)
    for token in decoder.tokens([b"y", b"z", b"ab"] * 3000):
        text.push([token])
    assert len(windows) == 9000 and not text.stopped
    assert max(length - new_from for length, new_from in windows) == 2
    assert max(new_from for _, new_from in windows) == text.hold == longest - 1
    assert len(text.finish()) == longest - 1 and text.released == 12000

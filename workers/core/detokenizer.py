"""A request's output text, grown one token at a time and released in safe pieces.

Each token's text comes from a :class:`~proto.tokenization.TextStream` (``tokenizers``'
``DecodeStream``: a window of the last few tokens decoded in Rust), so a long answer costs
O(n) in total, not O(n^2), and nothing is decoded here. A token that leaves the text in an
incomplete character (a multi-byte character split over tokens) adds nothing until a later
one completes it. When the request has stop strings, the text is also held back while its
tail could still become the start of one: what has been released is never taken back. When
a stop string appears, the text is cut before it and the request is over.

Stop strings are looked for only where a match can end in the new text: a token examines
at most its text plus ``len(s) - 1`` characters before it for each stop string ``s``,
and only the text not yet released is kept as one string (released pieces are joined only
when :attr:`IncrementalText.text` is read), so a token's work does not grow with the text
before it. The result is the same as searching the whole text after every token: a match
lying wholly in earlier text would have ended the request then.

Pushing tokens together is pushing them one at a time: each token's text, stop search and
``min_tokens`` check depend only on the tokens before it, and a push's released text is what
its tokens released one by one. So two workers that push the same tokens with the same stop
strings release the same text: a decode worker that continues a request after a remote
prefill rebuilds the released state by pushing the first token again, and one that resumes
a request pushes all its earlier tokens at once and releases nothing twice (even when they
end inside a character).

With ``min_tokens`` (vLLM's: no stop check before that many output tokens), stop strings are
not looked for in the text the first ``min_tokens - 1`` tokens complete; from the
``min_tokens``-th token on, a stop string ending in new text is found as usual, even one
that starts in the unchecked text (as vLLM, which searches the new text and the stop
string's length before it).
"""

from __future__ import annotations

from typing import Protocol


class TokenStream(Protocol):
    """One sequence's text, a piece per token (:class:`proto.tokenization.TextStream`)."""

    def step(self, token_id: int) -> str:
        """The text ``token_id`` completes ("" while a character is incomplete)."""
        ...


def find_stop(text: str, stop: tuple[str, ...], new_from: int) -> int:
    """Where the first stop string that ends in ``text[new_from:]`` starts, or -1.

    A stop string ``s`` is looked for only from ``new_from - len(s) + 1``: occurrences
    ending before ``new_from`` are not reported (they lie in text already searched). Of the
    matches, the one starting first wins. Work: O(len(text) - new_from + len(s)) per ``s``.
    """
    hits = [i for i in (text.find(s, max(0, new_from - len(s) + 1)) for s in stop) if i >= 0]
    return min(hits, default=-1)


class IncrementalText:
    """The text of one request's tokens, released so that no later token changes it.

    Contract: :meth:`push` tokens in order, then call :meth:`finish` once when the request
    ends (after it, nothing more is released). ``stopped`` tells that a stop string was found;
    the text is then cut before it and later pushes are ignored. ``stream`` is this request's
    own (a fresh :meth:`proto.tokenization.Tokenizer.stream`).
    """

    def __init__(
        self, stream: TokenStream, stop: tuple[str, ...] = (), min_tokens: int = 0
    ) -> None:
        """``min_tokens``: the request's; see the module docstring."""
        self.stream = stream
        self.stop = stop
        self.unchecked = max(0, min_tokens - 1)
        """How many first tokens' text is not searched for stop strings."""
        self.hold = max((len(s) for s in stop), default=1) - 1
        """How many characters at the end of the text are held back: a stop string may
        still start there."""
        self.num_tokens = 0
        """How many tokens were pushed (up to a stop string, once one is found)."""
        self.released = 0
        """How many characters of ``text`` have been handed out."""
        self.stopped = False
        self.finished = False
        """:meth:`finish` was called: later pushes are ignored (the text's tail was handed
        out, so it is no longer there to find a stop string across)."""
        self._pieces: list[str] = []
        """The released text, as handed out."""
        self._pending = ""
        """The decoded text not released yet: at most ``hold`` characters between pushes."""

    @property
    def text(self) -> str:
        """All decoded text so far (up to a stop string, once one is found). Joins every
        piece: O(length), meant for the end of a request."""
        return "".join(self._pieces) + self._pending

    def push(self, token_ids: list[int]) -> str:
        """Add tokens; returns the newly released text (may be empty)."""
        if self.finished:
            return ""
        for token_id in token_ids:
            if self.stopped:
                break
            new = self.stream.step(token_id)
            self.num_tokens += 1
            if self.num_tokens <= self.unchecked:
                self._pending += new
            elif new:
                self._add(new)
        return self._release()

    def _add(self, new: str) -> None:
        """Append ``new`` to the pending text, cut before a stop string ending in it."""
        window = self._pending + new
        cut = find_stop(window, self.stop, len(self._pending))
        if cut >= 0:
            window = window[:cut]
            self.stopped = True
        self._pending = window

    def _release(self, final: bool = False) -> str:
        """Hand out the pending text but its last ``hold`` characters (all of it when the
        text is final or stopped)."""
        keep = 0 if final or self.stopped else min(self.hold, len(self._pending))
        out = self._pending[: len(self._pending) - keep]
        self._pending = self._pending[len(out) :]
        if out:
            self._pieces.append(out)
            self.released += len(out)
        return out

    def finish(self) -> str:
        """The request ended: release everything still held back."""
        self.finished = True
        return self._release(final=True)

"""A request's output text, grown one token at a time and released in safe pieces.

Each :meth:`IncrementalText.push` decodes only a short window of tokens (the previous
token's context and the new ones), so a long answer costs O(n) in total, not O(n^2). Text
is held back while it ends in an incomplete character (a multi-byte character split over
tokens) and, when the request has stop strings, while its tail could still become the start
of one: what has been released is never taken back. When a stop string appears, the text is
cut before it and the request is over.

Stop strings are looked for only where a match can end in the new text: a push examines
at most the new text plus ``len(s) - 1`` characters before it for each stop string ``s``,
and only the text not yet released is kept as one string (released pieces are joined only
when :attr:`IncrementalText.text` is read), so a token's work does not grow with the text
before it. The result is the same as searching the whole text after every push: a match
lying wholly in earlier text would have ended the request then.

Two workers that push the same tokens with the same stop strings release the same text, so
a decode worker that continues a request after a remote prefill can rebuild the released
state by pushing the first token again.

With ``min_tokens`` (vLLM's: no stop check before that many output tokens), stop strings are
not looked for in the text the first ``min_tokens - 1`` tokens complete; from the
``min_tokens``-th token on, a stop string ending in new text is found as usual, even one
that starts in the unchecked text (as vLLM, which searches the new text and the stop
string's length before it). Which tokens are unchecked depends only on their index, so
pushing tokens one at a time or together (a resumed request) gives the same result.
"""

from __future__ import annotations

from typing import Protocol

INCOMPLETE = "\ufffd"


class Decoder(Protocol):
    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str: ...


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
    the text is then cut before it and later pushes are ignored.
    """

    def __init__(self, decoder: Decoder, stop: tuple[str, ...] = (), min_tokens: int = 0) -> None:
        """``min_tokens``: the request's; see the module docstring."""
        self.decoder = decoder
        self.stop = stop
        self.unchecked = max(0, min_tokens - 1)
        """How many first tokens' text is not searched for stop strings."""
        self.hold = max((len(s) for s in stop), default=1) - 1
        """How many characters at the end of the text are held back: a stop string may
        still start there."""
        self.token_ids: list[int] = []
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
        self._prefix_offset = 0
        self._read_offset = 0

    @property
    def text(self) -> str:
        """All decoded text so far (up to a stop string, once one is found). Joins every
        piece: O(length), meant for the end of a request."""
        return "".join(self._pieces) + self._pending

    def push(self, token_ids: list[int]) -> str:
        """Add tokens; returns the newly released text (may be empty)."""
        if self.stopped or self.finished:
            return ""
        split = min(len(token_ids), max(0, self.unchecked - len(self.token_ids)))
        if split:
            self._extend(token_ids[:split], search=False)
        if split < len(token_ids):
            self._extend(token_ids[split:], search=True)
        return self._release()

    def _extend(self, token_ids: list[int], search: bool) -> None:
        """Add tokens and their completed text to the pending text, looking for stop
        strings in it if ``search``."""
        self.token_ids.extend(token_ids)
        new = self._decode_new()
        if new and search:
            self._add(new)
        elif new:
            self._pending += new

    def _decode_new(self) -> str:
        """The text the new tokens complete ("" while it ends in an incomplete character);
        moves the decode window past them once they are complete."""
        prefix = self.decoder.decode(self.token_ids[self._prefix_offset : self._read_offset])
        full = self.decoder.decode(self.token_ids[self._prefix_offset :])
        if full.endswith(INCOMPLETE) or len(full) <= len(prefix):
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self.token_ids)
        return full[len(prefix) :]

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

"""A request's output text, grown one token at a time and released in safe pieces.

Each :meth:`IncrementalText.push` decodes only a short window of tokens (the previous
token's context and the new ones), so a long answer costs O(n) in total, not O(n^2). Text
is held back while it ends in an incomplete character (a multi-byte character split over
tokens) and, when the request has stop strings, while its tail could still become the start
of one: what has been released is never taken back. When a stop string appears, the text is
cut before it and the request is over.

Two workers that push the same tokens with the same stop strings release the same text, so
a decode worker that continues a request after a remote prefill can rebuild the released
state by pushing the first token again.
"""

from __future__ import annotations

from typing import Protocol

INCOMPLETE = "\ufffd"


class Decoder(Protocol):
    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str: ...


class IncrementalText:
    def __init__(self, decoder: Decoder, stop: tuple[str, ...] = ()) -> None:
        self.decoder = decoder
        self.stop = stop
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.token_ids: list[int] = []
        self.text = ""
        """All decoded text so far (up to a stop string, once one is found)."""
        self.released = 0
        """How many characters of ``text`` have been handed out."""
        self.stopped = False
        self._prefix_offset = 0
        self._read_offset = 0

    def push(self, token_ids: list[int]) -> str:
        """Add tokens; returns the newly released text (may be empty)."""
        if self.stopped:
            return ""
        self.token_ids.extend(token_ids)
        window = self.token_ids[self._prefix_offset :]
        prefix = self.decoder.decode(self.token_ids[self._prefix_offset : self._read_offset])
        full = self.decoder.decode(window)
        if not full.endswith(INCOMPLETE) and len(full) > len(prefix):
            start = max(0, len(self.text) - self.hold)
            self.text += full[len(prefix) :]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self.token_ids)
            self._find_stop(start)
        return self._release()

    def _find_stop(self, start: int) -> None:
        hits = [i for i in (self.text.find(s, start) for s in self.stop) if i >= 0]
        if hits:
            self.text = self.text[: min(hits)]
            self.stopped = True

    def _release(self, final: bool = False) -> str:
        end = len(self.text) if final or self.stopped else max(0, len(self.text) - self.hold)
        end = max(end, self.released)
        out = self.text[self.released : end]
        self.released = end
        return out

    def finish(self) -> str:
        """The request ended: release everything still held back."""
        return self._release(final=True)

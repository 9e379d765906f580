"""The requests one engine tracks, by id, from the moment it takes them until they end.

A :class:`RequestTable` is a read-only mapping (request id -> :class:`Sequence`) of the
requests the engine has queued or running, whatever their origin (new, resumed, adopted from
a reservation). Reservations are not in it (:mod:`workers.handoff.reservations` holds them); an id
names one request at a time, across both. It changes only through:

- :meth:`RequestTable.track` when the engine takes a request (its
  :class:`~workers.core.request_book.RequestBook` entry starts too);
- :meth:`RequestTable.made_elsewhere` for tokens another worker produced (a remote
  prefill's first token, or the outputs before a migration): sampling skips their draws and
  their text counts as released;
- :meth:`RequestTable.forget` when it ends, however it ends (its book entry, RNG and
  block-table row go too). The pages are the scheduler's business, not the table's.

Engine thread only, like the engine.
"""

from __future__ import annotations

import itertools
from collections.abc import Container, Iterator, Mapping
from typing import Protocol

from workers.core.request_book import RequestBook
from workers.core.request_checks import check_new
from workers.core.sequence import Sequence


class RequestRng(Protocol):
    """What the table needs of the model runner: each request's sampling RNG, whose draws a
    token made elsewhere skips, and which goes when the request does."""

    def skip_draws(self, seq: Sequence, count: int) -> None: ...

    def forget(self, request_id: str) -> None: ...


class RequestTable(Mapping[str, Sequence]):
    """``runner``: the model runner (:class:`RequestRng`); ``reserved``: the ids the
    engine's reservations hold (an id in use there is refused here too); ``vocab_size``: the
    model's, for the token ids of a new request."""

    def __init__(
        self, book: RequestBook, runner: RequestRng, reserved: Container[str], vocab_size: int
    ) -> None:
        self.book = book
        self.runner = runner
        self.reserved = reserved
        self.vocab_size = vocab_size
        self._by_id: dict[str, Sequence] = {}
        self._ids = itertools.count()

    def __getitem__(self, request_id: str) -> Sequence:
        return self._by_id[request_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_id)

    def __len__(self) -> int:
        return len(self._by_id)

    def new_id(self) -> str:
        """An id for a request that came without one (offline use)."""
        return f"req-{next(self._ids)}"

    def check_new(self, request_id: str, token_ids: list[int]) -> None:
        """``ValueError`` unless ``request_id`` is neither tracked nor reserved and
        ``token_ids`` fit the vocabulary (:func:`workers.core.request_checks.check_new`)."""
        check_new(request_id, token_ids, self.vocab_size, (self._by_id, self.reserved))

    def track(self, seq: Sequence) -> None:
        """Take ``seq`` (its id must be new: :meth:`check_new`)."""
        self._by_id[seq.request_id] = seq
        self.book.track(seq)

    def made_elsewhere(self, seq: Sequence, output_token_ids: list[int]) -> None:
        """Tracked ``seq``'s ``output_token_ids`` came from another worker."""
        self.runner.skip_draws(seq, len(output_token_ids))
        self.book.released(seq.request_id, output_token_ids)

    def forget(self, request_id: str) -> None:
        """Drop every trace of ``request_id`` (a no-op for an unknown id)."""
        self._by_id.pop(request_id, None)
        self.book.forget(request_id)
        self.runner.forget(request_id)

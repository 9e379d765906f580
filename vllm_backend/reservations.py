"""A vLLM worker's reservations: pages promised to prompts prefilled elsewhere.

vLLM allocates a request's pages when it schedules it, not before, so a decode worker over
vLLM cannot hold pages for a prompt still being prefilled, as our engine does. What it can
do, and what the router's ``Reserve`` is for, is refuse to take more than it has room for:
a reservation here is a count of pages (the prompt's and its first token's) held against
the pages vLLM reports free, under a lease. ``Reserve`` says "not now" while the free pages
less the pages already promised do not cover a prompt, and refuses outright a prompt and
output that could never fit the whole cache. The ``Generate`` that continues the request
takes its reservation over (:meth:`ReservationBook.take`); ``Abort`` and the lease end it
otherwise. All on the worker's event loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Held:
    pages: int
    deadline: float


class ReservationBook:
    """Reservations against a cache of ``total_pages`` pages of ``block_tokens`` tokens."""

    def __init__(
        self, total_pages: int, block_tokens: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.total_pages = total_pages
        self.block_tokens = block_tokens
        self.clock = clock
        self._held: dict[str, Held] = {}

    def pages_for(self, tokens: int) -> int:
        return -(-tokens // self.block_tokens)

    def reserve(
        self, request_id: str, prompt_tokens: int, max_tokens: int, lease_s: float, free: int
    ) -> int | None:
        """Promise ``request_id`` the pages of its prompt and first token, out of ``free``
        pages (vLLM's, now); their count, or None ("not now"). ValueError when the prompt
        and ``max_tokens`` could never fit the whole cache."""
        self.expire()
        if self.pages_for(prompt_tokens + max_tokens) > self.total_pages:
            raise ValueError(
                f"{prompt_tokens} prompt + {max_tokens} output tokens need more than this "
                f"worker's {self.total_pages} KV pages"
            )
        self.release(request_id)  # a retried reserve replaces its own
        pages = self.pages_for(prompt_tokens + 1)
        if pages > free - self.promised:
            return None
        self._held[request_id] = Held(pages, self.clock() + lease_s)
        return pages

    def _live(self) -> list[Held]:
        now = self.clock()
        return [held for held in list(self._held.values()) if held.deadline > now]

    @property
    def promised(self) -> int:
        """Pages promised and not yet taken over (leases that ran out do not count)."""
        return sum(held.pages for held in self._live())

    def __len__(self) -> int:
        return len(self._live())

    def holds(self, request_id: str) -> bool:
        self.expire()
        return request_id in self._held

    def take(self, request_id: str) -> bool:
        """The request's ``Generate`` takes its reservation over; whether it had one."""
        return self._held.pop(request_id, None) is not None

    def release(self, request_id: str) -> bool:
        return self._held.pop(request_id, None) is not None

    def expire(self) -> int:
        """End the reservations whose lease ran out; how many."""
        now = self.clock()
        gone = [rid for rid, held in self._held.items() if held.deadline <= now]
        for rid in gone:
            del self._held[rid]
        return len(gone)

"""A worker's role and its drain, as the gRPC servicer sees them.

Which verbs a role takes (:data:`ACCEPTS`):

- ``prefill``: ``Prefill``;
- ``decode``: ``Reserve``, ``Generate`` (with ``first_token``, or without for a prompt the
  router keeps local);
- ``mixed``: all of them.

A role change (:meth:`RoleSwitch.change`) drains first: ``draining`` is set and the record
re-published (``on_change``), new work is refused with ``UNAVAILABLE``
(:meth:`RoleSwitch.refusal`) while the worker finishes what it holds (its running requests
and its reservations: the ``Generate`` that takes one over is part of what it holds, so it
is let in: ``held``), then the role switches and the record is re-published again. A change
cancelled while draining (its deadline passed, the caller left) ends the drain and leaves
the role as it was. Changes run one at a time, in the order they came: a second waits for
the first to finish (or be cancelled), then drains anew if its role differs from the one
the first left. Everything here runs on the server's event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import grpc

log = logging.getLogger(__name__)

ACCEPTS = {
    "Prefill": ("prefill", "mixed"),
    "Reserve": ("decode", "mixed"),
    "Generate": ("decode", "mixed"),
}
"""Verb -> the roles that take it."""
DRAIN_POLL_S = 0.05
"""How often a drain asks whether the engine still holds work."""


class RoleSwitch:
    """``role`` and ``draining`` of one worker; ``on_change`` is called (on a thread: it
    reads the load and writes Redis) after either changed, to re-publish the record."""

    def __init__(self, role: str, on_change: Callable[[], None]) -> None:
        self.role = role
        self.draining = False
        self.on_change = on_change
        self._role_lock = asyncio.Lock()

    def refusal(self, verb: str, held: bool = False) -> tuple[grpc.StatusCode, str] | None:
        """Why a call of ``verb`` is refused now, or ``None``: UNAVAILABLE while draining
        (unless ``held``: it finishes work the worker already holds), FAILED_PRECONDITION
        if this role does not take ``verb``."""
        if self.draining and not held:
            return grpc.StatusCode.UNAVAILABLE, "worker is draining"
        if self.role not in ACCEPTS[verb]:
            return grpc.StatusCode.FAILED_PRECONDITION, f"a {self.role} worker does not take {verb}"
        return None

    async def change(self, role: str, busy: Callable[[], Awaitable[bool]]) -> str:
        """Switch to ``role`` once ``busy()`` says the engine holds no work (see the module
        docstring); returns the role before. Waits its turn behind an earlier change."""
        async with self._role_lock:  # one change at a time, in arrival order
            previous = self.role
            if role != previous:
                await self._change_role(role, busy)
            return previous

    async def _change_role(self, role: str, busy: Callable[[], Awaitable[bool]]) -> None:
        previous = self.role
        self.draining = True
        await asyncio.to_thread(self.on_change)
        try:
            while await busy():
                await asyncio.sleep(DRAIN_POLL_S)
        except asyncio.CancelledError:
            self.draining = False
            await asyncio.shield(asyncio.to_thread(self.on_change))
            log.info("role change to %s cancelled: still %s", role, previous)
            raise
        self.role, self.draining = role, False
        await asyncio.to_thread(self.on_change)
        log.info("role changed from %s to %s", previous, self.role)

"""The router's queue for KV memory (router/placement/kv_wait.py): FIFO turns, wakes, deadlines and
cancellation, against a fake pool of free pages. No worker, no network: attempts are plain
coroutines and every wait is driven by explicit wakes (long ``retry_s``), so no test
depends on how fast this machine is."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from router.placement.kv_wait import KVWaitQueue

FOREVER = 600.0


class Pages:
    """Free pages of a fake decode worker, and every attempt made on it."""

    def __init__(self, free: int = 0) -> None:
        self.free = free
        self.attempts: list[str] = []

    def attempt(self, name: str, need: int) -> Callable[[], Awaitable[str | None]]:
        """An attempt that takes ``need`` pages when free (returns ``name``), else None."""

        async def run() -> str | None:
            self.attempts.append(name)
            if self.free < need:
                return None
            self.free -= need
            return name

        return run


class Recorder:
    def __init__(self) -> None:
        self.counts: list[float] = []
        self.waited: list[float] = []

    def queue(self, retry_s: float = FOREVER) -> KVWaitQueue:
        return KVWaitQueue(self.counts.append, self.waited.append, retry_s=retry_s)


def forever() -> float:
    return FOREVER


async def settle() -> None:
    """Let every ready task run until all of them wait again."""
    for _ in range(20):
        await asyncio.sleep(0)


def test_a_request_that_gets_through_at_once_never_queues() -> None:
    async def main() -> None:
        rec, pages = Recorder(), Pages(free=4)
        queue = rec.queue()
        assert await queue.admit(pages.attempt("a", 3), forever) == "a"
        assert len(queue) == 0 and rec.counts == [] and rec.waited == []

    asyncio.run(main())


def test_waiters_get_through_in_arrival_order_and_only_the_head_tries() -> None:
    """A big request at the head is not passed by the small ones behind it, even when
    their pages are free; once it is through, the others follow at once, in order."""

    async def main() -> None:
        rec, pages = Recorder(), Pages(free=0)
        queue = rec.queue()
        done: list[str] = []

        async def request(name: str, need: int) -> None:
            done.append(await queue.admit(pages.attempt(name, need), forever))

        tasks = [asyncio.create_task(request(n, k)) for n, k in (("big", 5), ("s1", 1), ("s2", 1))]
        await settle()
        assert len(queue) == 3 and rec.counts[-1] == 3
        assert pages.attempts == ["big"]  # the others found a queue: no attempt of theirs
        pages.free = 2
        queue.wake()
        await settle()
        assert pages.attempts == ["big", "big"] and done == []  # s1, s2 would fit: they wait
        pages.free = 7
        queue.wake()
        await asyncio.gather(*tasks)
        assert done == ["big", "s1", "s2"] and pages.free == 0
        assert len(queue) == 0 and rec.counts[-1] == 0 and len(rec.waited) == 3

    asyncio.run(main())


def test_nothing_is_tried_without_a_wake() -> None:
    """Waiting is not polling: with no signal (and a long ``retry_s``) no attempt is made;
    each wake makes one attempt of the head."""

    async def main() -> None:
        pages = Pages(free=0)
        queue = Recorder().queue()
        task = asyncio.create_task(queue.admit(pages.attempt("a", 1), forever))
        await asyncio.sleep(0.2)
        assert pages.attempts == ["a"]
        for _ in range(3):
            queue.wake()
            await settle()
        assert pages.attempts == ["a"] * 4
        pages.free = 1
        queue.wake()
        assert await task == "a"

    asyncio.run(main())


def test_without_any_signal_the_head_retries_after_retry_s() -> None:
    async def main() -> None:
        pages = Pages(free=0)
        queue = Recorder().queue(retry_s=0.01)
        task = asyncio.create_task(queue.admit(pages.attempt("a", 1), forever))
        while len(pages.attempts) < 3:
            await asyncio.sleep(0.01)
        pages.free = 1
        assert await task == "a"

    asyncio.run(main())


def test_a_wake_during_the_first_attempt_is_not_lost() -> None:
    """Pages freed while the first attempt was being refused: it tries again at once."""

    async def main() -> None:
        pages = Pages(free=0)
        queue = Recorder().queue()

        async def refused_while_pages_free() -> str | None:
            got = await pages.attempt("a", 1)()
            if got is None:
                pages.free = 1
                queue.wake()
            return got

        task = asyncio.create_task(queue.admit(refused_while_pages_free, forever))
        await settle()
        assert task.done() and task.result() == "a"

    asyncio.run(main())


@pytest.mark.parametrize("how", ["deadline", "cancel", "error"])
def test_a_waiter_that_gives_up_leaves_no_trace(how: str) -> None:
    """Past its deadline (TimeoutError), cancelled (the client left) or failing (its
    attempt raised): the head leaves the queue, and the next one tries at once."""

    async def main() -> None:
        rec, pages = Recorder(), Pages(free=0)
        queue = rec.queue()
        left = [FOREVER]

        async def fails() -> str | None:
            pages.attempts.append("head")
            if how == "error" and len(pages.attempts) > 1:
                raise RuntimeError("no worker left")
            return None

        head = asyncio.create_task(queue.admit(fails, lambda: left[0]))
        await settle()
        nxt = asyncio.create_task(queue.admit(pages.attempt("next", 1), forever))
        await settle()
        pages.free = 1
        if how == "deadline":
            left[0] = 0.0
        if how == "cancel":
            head.cancel()
        queue.wake()
        error = {"deadline": TimeoutError, "cancel": asyncio.CancelledError}
        with pytest.raises(error.get(how, RuntimeError)):
            await head
        assert await nxt == "next"
        assert len(queue) == 0 and rec.counts[-1] == 0 and len(rec.waited) == 2

    asyncio.run(main())


def test_the_deadline_ends_a_wait_with_no_signal() -> None:
    async def main() -> None:
        rec = Recorder()
        queue = rec.queue()
        with pytest.raises(TimeoutError):
            await queue.admit(Pages(free=0).attempt("a", 1), lambda: 0.05)
        assert len(queue) == 0 and rec.counts == [1, 0]

    asyncio.run(main())


def test_retry_s_must_be_positive() -> None:
    with pytest.raises(ValueError):
        KVWaitQueue(retry_s=0)

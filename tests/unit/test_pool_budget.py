"""PoolBudget: chain eviction's byte budget from the master's reported capacity."""

from __future__ import annotations

import time

import pytest

from kvpool.budget import PoolBudget
from kvpool.master import MasterStats


def stats(capacity: int) -> MasterStats:
    return MasterStats(capacity, 0, 0, 0, 0)


def test_the_budget_is_a_share_of_the_last_capacity_read() -> None:
    answers: list[MasterStats | Exception] = [stats(0), stats(1000), OSError("down"), stats(2000)]

    def read(url: str) -> MasterStats:
        assert url == "http://m:9003/metrics"
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    budget = PoolBudget("http://m:9003/metrics", 0.85, read=read)
    assert budget() is None  # never read: unknown, nothing is evicted
    budget.refresh()
    assert budget() is None  # no segment mounted yet: still unknown, never 0
    budget.refresh()
    assert budget() == 850
    budget.refresh()  # a failed read keeps the last value
    assert budget() == 850 and budget.capacity_bytes == 1000
    budget.refresh()
    assert budget() == 1700


def test_the_reader_thread_starts_and_stops() -> None:
    seen: list[str] = []

    def read(url: str) -> MasterStats:
        seen.append(url)
        return stats(10)

    budget = PoolBudget("u", 0.5, refresh_s=0.01, read=read)
    budget.start()
    deadline = time.monotonic() + 30
    while not seen and time.monotonic() < deadline:  # the thread's first read
        time.sleep(0.01)
    budget.close()
    assert seen and budget() == 5
    with pytest.raises(ValueError):
        PoolBudget("u", 0.0)

"""Prompts to token ids: the served model's tokenizer and chat template, read locally.

The tokenizer is the wrapper the workers use too (:class:`proto.tokenization.Tokenizer`);
this module holds the router's part of it: one load in the background, and the threads
that run it. The router tokenizes so that it can check lengths, look prompts up in the
pool and hand workers token ids. The directory is a Hugging Face model directory on this machine
(``tokenizer.json``, ``tokenizer_config.json``, a chat template); nothing is fetched. It
is the router's own ``tokenizer_dir`` setting, never a path read from the worker registry
(a record's ``model_dir`` names a directory on the worker's machine, and whoever can write
to Redis could name any directory in it). Tokenizing is CPU work (about a second for a
1 MiB prompt on these machines): the router runs it in a few threads
(:meth:`TokenizerSlot.off_loop`), never on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar, TypeVarTuple

import anyio
import anyio.to_thread

from proto.tokenization import Tokenizer

log = logging.getLogger(__name__)
T = TypeVar("T")
Ts = TypeVarTuple("Ts")

TOKENIZE_THREADS = 4
"""Threads that tokenize at once, per router. A few: tokenizing is CPU work (the fast
tokenizer releases the GIL, so they do run in parallel), more threads than cores buy
nothing, and requests beyond them wait in turn, each holding no more than its body."""


class TokenizerSlot:
    """The router's one tokenizer, loaded once and off the event loop.

    Loading it imports transformers' tokenizer classes, which takes seconds on a small machine;
    done lazily, the first request after a start paid for it (a TTFT of ~7 s on 2 cores). Lifecycle:

    1. :meth:`preload` starts the load in the background (the router calls it at start with
       ``tokenizer_dir``); it does nothing once a load started (running, done or failed);
    2. while that load runs, :attr:`loading` is True (``/health`` answers 503 then, so that
       ``kvserve up`` and load balancers call the router ready only when a request will not
       wait for the import);
    3. :meth:`get` returns the tokenizer, awaiting the running load or starting one; a failed
       load is logged once and raises its error to the requests that await it; each later
       :meth:`get` tries again (a fixed directory serves without a restart);
    4. :meth:`off_loop` runs the tokenizer's work for a request in a thread.
    """

    def __init__(self) -> None:
        self._tokenizer: Tokenizer | None = None
        self._task: asyncio.Task[Tokenizer] | None = None
        self._threads = anyio.CapacityLimiter(TOKENIZE_THREADS)

    @property
    def loading(self) -> bool:
        return self._task is not None and not self._task.done()

    def preload(self, model_dir: Path) -> None:
        """Start loading from ``model_dir`` in the background, unless a load has started
        already (needs a running loop)."""
        if self._task is None:
            self._start(model_dir)

    def _start(self, model_dir: Path) -> None:
        self._task = asyncio.get_running_loop().create_task(self._load(model_dir))
        self._task.add_done_callback(_retrieve)  # a failure nobody awaited is logged only

    async def get(self, model_dir: Callable[[], Path]) -> Tokenizer:
        """The tokenizer; ``model_dir`` says where it is when no load has started yet."""
        if self._tokenizer is not None:
            return self._tokenizer
        if self._task is None or self._task.done():  # none started, or the last one failed
            self._start(model_dir())
        assert self._task is not None
        return await asyncio.shield(self._task)

    async def off_loop(self, work: Callable[[*Ts], T], *args: *Ts) -> T:
        """``work(*args)`` (e.g. ``tok.encode, text``) in one of at most
        :data:`TOKENIZE_THREADS` threads, waiting for a free one, so that a huge prompt does
        not stall other requests' streams. A caller cancelled meanwhile (its client left)
        returns only once its work has ended, which tokenizing always does."""
        return await anyio.to_thread.run_sync(work, *args, limiter=self._threads)

    async def _load(self, model_dir: Path) -> Tokenizer:
        try:
            tok = await asyncio.to_thread(Tokenizer, model_dir)
        except Exception as exc:
            log.warning("could not load the tokenizer from %s: %s", model_dir, exc)
            raise
        self._tokenizer = tok
        return tok


def _retrieve(task: asyncio.Task[Tokenizer]) -> None:
    if not task.cancelled():
        task.exception()

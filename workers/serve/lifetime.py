"""A child process that must not outlive its parent (a worker's helpers, a launcher's
children): Linux's parent-death signal."""

from __future__ import annotations

import contextlib
import os
import signal

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask Linux for ``sig`` when this process's parent dies (called in the child: before
    exec by a launcher, or first thing by a helper process); if the parent is gone already
    (this process was re-parented), ``sig`` at once.

    Linux sends it when the *thread* that forked the child exits, not only the process:
    start children from a thread that outlives them (the main thread), never from a
    short-lived helper thread, or they are stopped when that thread ends."""
    parent = os.getppid()
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, sig)
    if parent == 1 or os.getppid() != parent:
        os.kill(os.getpid(), sig)

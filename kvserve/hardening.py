"""Closing a kvserve process to inspection by other processes of the same user.

Every process started as the ``kvserve`` command (:func:`kvserve.cli.main` with the command
line's own arguments) calls :func:`forbid_inspection` first: on Linux it becomes
non-dumpable, so another process of the same user (a broken-into worker next to the router
under ``kvserve up``) can neither read its ``/proc/<pid>/environ`` (the router's grant and
API keys, a worker's grant), ``mem`` or file descriptors, nor attach a debugger to it; only
a holder of ``CAP_SYS_PTRACE`` (root, usually) still can, and the process leaves no core
dump. Processes kvserve starts but does not run (Redis, ``mooncake_master``, nginx, vLLM's
own engine processes) are not covered; docs/security.md says what each launch path
protects.
"""

from __future__ import annotations

import ctypes
import sys

PR_SET_DUMPABLE = 4
"""``prctl`` option (linux/prctl.h)."""


def forbid_inspection() -> bool:
    """Make this process non-dumpable (module docstring); True when it is now, False where
    that is not possible (not Linux, or ``prctl`` refused)."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return int(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)) == 0

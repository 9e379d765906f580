"""The one wrapper for every child process the project runs: redis-server
(:mod:`kvserve.cluster.redis`), the pool's ``mooncake_metadata`` and ``mooncake_master``
(:mod:`kvserve.cluster.pool`), workers and the router (:mod:`kvserve.cluster.launch`),
benchmark peers (:mod:`kvserve.bench`).

Lifecycle of a :class:`ManagedProcess`:

1. ``start()`` runs the :class:`Readiness`'s ``before`` check (e.g. "the ports are free"),
   then spawns the command, output appended to its log file (or, with no log file, to
   the launcher's own output). By default the child gets its own session (so a terminal's
   Ctrl-C reaches only the launcher, which then stops the children in order), optionally
   pinned to CPU cores (``taskset`` when present, else ``sched_setaffinity`` in the
   child); on Linux it also gets SIGTERM if the launcher dies without stopping it (killed,
   or a signal it does not handle), so no orphan outlives its cluster; its environment is
   :func:`child_environment`: the launcher's variables on an allow-list plus the child's
   own (secrets travel there, never in argv), and optionally ``stdin`` bytes (Redis reads
   its credentials from there, so they never touch the disk). A ``foreground`` child
   instead stays in the launcher's process group and environment, as a command-line
   tool's children do (``kvserve pool``: a terminal's Ctrl-C reaches it directly);
2. with a :class:`Readiness`, ``start()`` then waits until its ``check`` passes (Redis
   PING, ports that accept connections); if the child exits first or the timeout passes,
   the child is stopped and the error (:meth:`ManagedProcess.failure`) names it, its exit
   status and its log. Without one, ``start()`` returns at once and the owner waits its
   own way (workers and the router: gRPC health and HTTP, many at once);
3. ``running`` says whether it is alive; ``stop(grace)`` sends SIGTERM to the process
   group (a foreground child: to the process), waits ``grace`` seconds (the wrapper's
   default if not given), then SIGKILLs it; it is idempotent and also sweeps any leftover
   member of the group;
4. ``restart()`` is ``stop()`` then ``start()``: on failure the child is left stopped.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from workers.serve.lifetime import die_with_parent


class MissingBinaryError(FileNotFoundError, RuntimeError):
    """A Debian package's program is not installed (both a FileNotFoundError and a
    RuntimeError: callers of either kind catch it)."""


def debian_binary(name: str, package: str) -> str:
    """The path of program ``name`` (on ``PATH``, else in ``/usr/sbin`` or ``/usr/bin``,
    where Debian's ``package`` puts it: a user's ``PATH`` may lack ``/usr/sbin``);
    :class:`MissingBinaryError` saying how to install it otherwise."""
    search = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/bin"])
    found = shutil.which(name, path=search)
    if not found:
        raise MissingBinaryError(
            f"{name} not found: install Debian's {package} (scripts/setup.sh does)"
        )
    return found


def tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a log file ('' if it does not exist)."""
    try:
        text = path.read_bytes()[-64 * 1024 :].decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


INHERITED = frozenset(
    {
        *("PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ"),
        *("TMPDIR", "TMP", "TEMP", "VIRTUAL_ENV", "XDG_CACHE_HOME"),
        *("LD_LIBRARY_PATH", "LD_PRELOAD", "CC", "CXX", "MAX_JOBS"),
        *("HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"),
        "KVSERVE_CACHE_DIR",  # the model and kernel cache (workers.config.CacheConfig): no flag
    }
)
"""Variables of the launcher every child gets (when set): what locates programs, files,
the locale and the model cache. No ``KVSERVE_*`` setting is among them: a child gets its
settings as flags and its secrets from its own environment (:class:`ManagedProcess`)."""
INHERITED_PREFIXES = (
    *("LC_", "PYTHON", "OMP_", "KMP_", "MKL_", "OPENBLAS_", "GOMP_", "TORCH_"),
    *("CUDA_", "NVIDIA_", "NCCL_", "MC_", "GLOG_", "GRPC_"),
)
"""...and every variable starting with one of these: the locale, the interpreter, the
thread pools of torch and its BLAS, the GPU runtime (``CUDA_VISIBLE_DEVICES``), Mooncake's
transfer engine (``MC_*``) and its logging, gRPC's tracing."""


def inherited(name: str) -> bool:
    """Whether a launcher's variable ``name`` reaches children (:data:`INHERITED`)."""
    return name in INHERITED or name.startswith(INHERITED_PREFIXES)


def child_environment(
    own: Mapping[str, str], launcher: Mapping[str, str] | None = None
) -> dict[str, str]:
    """A child's whole environment: the ``launcher``'s variables (default ``os.environ``)
    that :func:`inherited` allows, then ``own`` over them. So a ``KVSERVE_API_KEY`` or any
    other secret of the launcher reaches a child only when ``own`` names it."""
    source = os.environ if launcher is None else launcher
    return {**{k: v for k, v in source.items() if inherited(k)}, **own}


@dataclass(frozen=True)
class Readiness:
    """How a child shows that it is ready: ``check()`` turns true. ``failure`` ends the
    sentence "<name> ..." of the error when it does not (e.g. ``did not answer PING on port
    6379``); ``before``, if given, runs before each spawn and raises to refuse it (e.g.
    "the ports are already in use": a check that other process would pass)."""

    check: Callable[[], bool]
    failure: str
    before: Callable[[], None] | None = None


class ManagedProcess:
    """One child process (the lifecycle is in the module docstring).

    ``log_path``: where its output is appended (None: the launcher's own output). ``env``:
    the child's own environment, on top of the inherited allow-list
    (:func:`child_environment`; a ``foreground`` child gets the launcher's whole
    environment under it). ``stdin``, when given, is written to the child's standard
    input, which is then closed, at every start (else it reads from /dev/null, or, in the
    foreground, the launcher's). ``ready``: the readiness ``start()`` waits for. ``grace``:
    the default seconds :meth:`stop` waits before SIGKILL."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path | None,
        env: Mapping[str, str] | None = None,
        cores: Sequence[int] = (),
        prefix: Sequence[str] = (),
        stdin: bytes | None = None,
        *,
        ready: Readiness | None = None,
        grace: float = 10.0,
        foreground: bool = False,
    ) -> None:
        self.name = name
        self.argv = [*prefix, *argv]
        self.log_path = log_path
        self.env = dict(env or {})
        self.cores = tuple(cores)
        self.ready = ready
        self.grace = grace
        self.foreground = foreground
        self._stdin = stdin
        self._proc: subprocess.Popen[bytes] | None = None
        self._stopped = False  # stop() done: no more signals to a possibly reused pid

    def _command(self) -> tuple[list[str], Callable[[], None] | None]:
        """The argv to spawn and what the child runs before exec."""
        if self.foreground:
            return self.argv, None
        if not self.cores:
            return self.argv, die_with_parent
        taskset = shutil.which("taskset")
        if taskset:
            return [taskset, "-c", ",".join(map(str, self.cores)), *self.argv], die_with_parent
        cores = set(self.cores)

        def setup() -> None:
            die_with_parent()
            os.sched_setaffinity(0, cores)

        return self.argv, setup

    def start(self, timeout: float = 20.0) -> ManagedProcess:
        """Spawn the command (again, if it has exited; nothing if it runs), then wait up to
        ``timeout`` seconds for its readiness, if it has one (steps 1-2)."""
        if self.running:
            return self
        if self.ready is not None and self.ready.before is not None:
            self.ready.before()
        self._spawn()
        if self.ready is not None:
            self.wait_ready(self.ready, timeout)
        return self

    def _spawn(self) -> None:
        argv, preexec = self._command()
        self._stopped = False
        quiet = subprocess.DEVNULL if not self.foreground else None
        with contextlib.ExitStack() as files:
            log: IO[bytes] | None = None
            if self.log_path is not None:
                self.log_path.parent.mkdir(parents=True, exist_ok=True)
                log = files.enter_context(self.log_path.open("ab"))
            self._proc = subprocess.Popen(
                argv,
                stdin=quiet if self._stdin is None else subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT if log is not None else None,
                env={**os.environ, **self.env} if self.foreground else child_environment(self.env),
                start_new_session=not self.foreground,
                preexec_fn=preexec,
            )
        if self._stdin is not None:
            _feed(self._proc.stdin, self._stdin)

    def wait_ready(self, ready: Readiness, timeout: float) -> None:
        """Poll ``ready.check`` until it passes; if the child exits first or ``timeout``
        seconds pass (or on any interruption), stop the child and raise its failure."""
        deadline = time.monotonic() + timeout
        try:
            while not ready.check():
                if not self.running or time.monotonic() > deadline:
                    raise self.failure(ready.failure)
                time.sleep(0.05)
        except BaseException:  # also Ctrl-C while waiting: nothing is left running
            self.stop()
            raise

    def restart(self, grace: float | None = None, timeout: float = 20.0) -> ManagedProcess:
        """Stop (``grace`` seconds before SIGKILL) and start again (step 4)."""
        self.stop(grace)
        return self.start(timeout)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        """Exit status once exited (negative: killed by that signal); None while running."""
        return self._proc.poll() if self._proc is not None else None

    def send_signal(self, sig: int) -> None:
        """Signal the process itself (e.g. SIGKILL to simulate a crash)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(sig)

    def terminate(self) -> None:
        """SIGTERM to the whole group, without waiting (safe inside a signal handler)."""
        if self.running:
            self._signal_group(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        assert self._proc is not None, f"{self.name} was never started"
        return self._proc.wait(timeout)

    def stop(self, grace: float | None = None) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds (default: :attr:`grace`);
        idempotent (step 3)."""
        if self._proc is None or self._stopped:
            return
        self._stopped = True
        self.terminate()
        try:
            self._proc.wait(self.grace if grace is None else grace)
        except subprocess.TimeoutExpired:
            self._signal_group(signal.SIGKILL)
            self._proc.wait()
        self._signal_group(signal.SIGKILL)  # anything the child left behind in its group

    def _signal_group(self, sig: int) -> None:
        """``sig`` to the child's process group; to the child alone in the foreground (it
        shares the launcher's group), and only while it has not been reaped."""
        assert self._proc is not None
        if self.foreground:
            self.send_signal(sig)
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, sig)

    def log_tail(self, lines: int = 30) -> str:
        return tail(self.log_path, lines) if self.log_path is not None else ""

    def failure(self, what: str) -> RuntimeError:
        """An error naming this process, its exit status and the tail of its log."""
        code = self.returncode
        state = "is still running" if code is None else f"exited with status {code}"
        if self.log_path is None:
            return RuntimeError(f"{self.name} {what}: it {state}; see the output above")
        return RuntimeError(
            f"{self.name} {what}: it {state}; last lines of {self.log_path}:\n{self.log_tail()}"
        )


def _feed(pipe: IO[bytes] | None, data: bytes) -> None:
    """Write ``data`` to a child's stdin and close it (a child that exited early, and so
    closed its end, is found out by its owner's readiness check)."""
    assert pipe is not None
    with contextlib.suppress(BrokenPipeError), pipe:
        pipe.write(data)

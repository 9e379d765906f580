"""The native CPU paged-attention kernels (a C++ extension built on first use).

The sources are in ``workers/model/csrc/``. They are compiled with
``torch.utils.cpp_extension.load`` (``-O3 -march=native -fopenmp``) into
``<cache_dir>/kernels/paged_attention-<key>/``, where ``cache_dir`` is
:func:`workers.model.prepare.cache_dir` (``$KVSERVE_CACHE_DIR`` or ``~/.cache/kvserve``) and
``key`` hashes the sources, the flags, the torch and Python versions, the compiler and the
CPU (model and feature flags): a change of any of them, or a machine of another kind sharing
the cache, builds anew instead of loading a binary that may not run there. Concurrent builds
(several workers starting at once) are serialized by an ``flock`` on ``build.flock`` in that
folder, taken before cpp_extension runs: the kernel releases it when its holder dies, so
whoever holds it knows that any cpp_extension baton (``lock``) still there was left by a
killed build and removes it at once (a stale baton used to stall every later worker).
A binary already built for the key is loaded as it is, without cpp_extension: the key
covers everything it was built from, so it fits whichever checkout built it (cpp_extension
would rebuild it for a checkout at another path, holding the lock for minutes while every
worker starting meanwhile waits); one that does not load (a build killed while linking) is
built again. A folder this process cannot write (one a launcher prepared for processes of
other accounts: ``kvserve.cluster.shared_cache``) is loaded from without the lock: nobody
builds there.

Nothing is built or loaded at import: :func:`available` (for callers that can fall back to
the torch path) and :func:`build` (for the setup script) do it once per process, under a
lock. ``python -m workers.model.native`` builds it and prints where (exit status 1 and the
compiler's message on failure).

Ops (every tensor on the CPU; the cache is ``[num_blocks, 2, block_tokens, kv_heads,
head_dim]``, contiguous, float32, bfloat16 or float16; both release the GIL):

- :func:`write_kv` copies the step's K/V rows into their slots.
- :func:`paged_attention` is one varlen causal attention over the paged cache for decode
  tokens and prefill chunks alike, reading K/V in place.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import logging
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import torch

from workers.model.prepare import cache_dir

log = logging.getLogger(__name__)

CSRC = Path(__file__).parent / "csrc"
SOURCES = ("ops.cpp", "paged_attention.cpp", "pointwise.cpp")
CFLAGS = ("-O3", "-march=native", "-fopenmp", "-Wall", "-Wno-unused-function")
LDFLAGS = ("-fopenmp",)

_lock = threading.Lock()
_module: ModuleType | None = None
_error: str | None = None


def _cpu_identity() -> str:
    """The CPU's model and feature flags (what ``-march=native`` compiles for)."""
    parts = [platform.machine()]
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    wanted = ("vendor_id", "model name", "cpu family", "model", "flags", "features", "cpu part")
    seen: set[str] = set()
    for line in lines:
        name, _, value = line.partition(":")
        name = name.strip().lower()
        if name in wanted and name not in seen:
            seen.add(name)
            parts.append(f"{name}={' '.join(sorted(value.split()))}")
    if len(parts) == 1:
        parts.append(platform.processor())
    return "\n".join(parts)


def _compiler_version() -> str:
    cxx = os.environ.get("CXX", "c++")
    try:
        res = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        return f"{cxx}: {e}"
    return f"{cxx}: {res.stdout.strip()}"


def cache_key() -> str:
    """Hash of everything the built binary depends on (16 hex digits)."""
    h = hashlib.sha256()
    for path in sorted(CSRC.iterdir()):
        if path.suffix in (".cpp", ".h"):
            h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    for part in (*CFLAGS, "|", *LDFLAGS, torch.__version__, sys.version, _compiler_version()):
        h.update(part.encode() + b"\0")
    h.update(_cpu_identity().encode())
    return h.hexdigest()[:16]


def build_dir(key: str | None = None) -> Path:
    """Where the extension for this machine is (or will be) built."""
    return cache_dir() / "kernels" / f"paged_attention-{key or cache_key()}"


def _module_name(key: str) -> str:
    return f"kvserve_paged_attention_{key}"


def library(key: str | None = None) -> Path:
    """The built extension's file in :func:`build_dir` (present once :func:`build` ran)."""
    key = key or cache_key()
    return build_dir(key) / f"{_module_name(key)}.so"


def _ensure_ninja_on_path() -> None:
    """cpp_extension runs ``ninja`` from PATH; a virtualenv's may not be on it."""
    if shutil.which("ninja") is None:
        scripts = sysconfig.get_path("scripts")
        os.environ["PATH"] = scripts + os.pathsep + os.environ.get("PATH", "")


@contextlib.contextmanager
def _build_lock(folder: Path) -> Iterator[None]:
    """Hold the folder's build ``flock`` (blocking until no other process does); inside
    it, no live build owns cpp_extension's baton, so one found there is removed."""
    with (folder / "build.flock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        baton = folder / "lock"
        if baton.exists():
            log.warning("removing a build lock left by a killed build: %s", baton)
            baton.unlink(missing_ok=True)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _load() -> ModuleType:
    key = cache_key()
    folder = build_dir(key)
    if folder.is_dir() and not os.access(folder, os.W_OK):  # prepared for us: no builder
        built = _load_built(key, folder)
        if built is None:
            raise ImportError(f"no loadable build in {folder}, which this process cannot write")
        return built
    folder.mkdir(parents=True, exist_ok=True)
    with _build_lock(folder):
        built = _load_built(key, folder)
        return built if built is not None else _compile(key, folder)


def _load_built(key: str, folder: Path) -> ModuleType | None:
    """The extension built in ``folder`` for ``key``, loaded as it is; None when there is
    none, or it does not load (then it is built again). Call under the build lock."""
    name, path = _module_name(key), folder / library(key).name
    spec = importlib.util.spec_from_file_location(name, path) if path.is_file() else None
    if spec is None or spec.loader is None:
        return None
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except ImportError as exc:
        log.warning("the kernels built in %s do not load (%s): building them again", folder, exc)
        return None
    return module


def _compile(key: str, folder: Path) -> ModuleType:
    from torch.utils import cpp_extension

    _ensure_ninja_on_path()
    cpp_extension.verify_ninja_availability()
    module = cpp_extension.load(
        name=_module_name(key),
        sources=[str(CSRC / s) for s in SOURCES],
        extra_cflags=list(CFLAGS),
        extra_ldflags=list(LDFLAGS),
        build_directory=str(folder),
        verbose=False,
    )
    assert isinstance(module, ModuleType)
    return module


def build() -> None:
    """Builds (or loads the cached build of) the extension; raises with the compiler's
    message if it fails. Safe to call from several threads and processes at once."""
    global _module, _error
    with _lock:
        if _module is not None:
            return
        try:
            _module = _load()
        except Exception as e:
            _error = f"{type(e).__name__}: {e}"
            raise
        _error = None


def available() -> bool:
    """Whether the kernels can be used; builds them on the first call (which may take a
    few minutes where the setup script has not). Never raises: a failure is logged once,
    with the reason (see :func:`unavailable_reason`), and remembered for the process."""
    global _module, _error
    if _module is not None:
        return True
    with _lock:
        if _module is not None:
            return True
        if _error is not None:
            return False
        try:
            _module = _load()
        except Exception as e:
            _error = f"{type(e).__name__}: {e}"
            log.warning("native paged-attention kernels unavailable: %s", _error)
            return False
        return True


def unavailable_reason() -> str | None:
    """Why :func:`available` returned False (None if it has not, or did not fail)."""
    return _error


def ops() -> ModuleType:
    """The loaded extension (built on first use); ``RuntimeError`` if it cannot be."""
    if _module is None and not available():
        raise RuntimeError(f"native paged-attention kernels unavailable: {_error}")
    assert _module is not None
    return _module


def vector_width() -> int:
    """fp32 lanes per SIMD vector the kernels were compiled for (16 AVX-512, 8 AVX2)."""
    return int(ops().vector_width())


def write_kv(
    k: torch.Tensor, v: torch.Tensor, layer_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Writes ``k[t]``/``v[t]`` into ``layer_cache[page, 0, offset]``/``[page, 1, offset]``,
    where ``slot_mapping[t] = page * block_tokens + offset``; a negative slot skips token t.

    ``k``/``v``: ``[T, kv_heads, head_dim]`` in the cache's dtype, any strides (views into
    a fused QKV output are fine, nothing is copied). ``slot_mapping``: int64 ``[T]``,
    contiguous. Two tokens with the same slot: one of them wins, unspecified which.
    Raises ``RuntimeError`` on bad shapes, dtypes or slots past the cache.
    """
    ops().write_kv(k, v, layer_cache, slot_mapping)


def paged_attention(
    out: torch.Tensor,
    q: torch.Tensor,
    layer_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    query_starts: torch.Tensor,
    scale: float,
) -> None:
    """Causal attention of ``q`` over the paged cache, written into ``out``.

    - ``q``/``out``: ``[T, q_heads, head_dim]``, same dtype (float32, bfloat16 or
      float16; it need not be the cache's), last dimension contiguous (other strides free).
      q head ``h`` reads kv head ``h // (q_heads // kv_heads)``.
    - ``block_tables``: int32 ``[S, W]``, sequence s's pages in order (entries past its
      ``ceil(context_lens[s] / block_tokens)`` pages are ignored).
    - ``context_lens``: int32 ``[S]``, tokens of sequence s in the cache *including* this
      step's, which :func:`write_kv` must already have written.
    - ``query_starts``: int32 ``[S + 1]``, non-decreasing; sequence s's queries are rows
      ``query_starts[s]:query_starts[s + 1]`` of q. Its i-th query (of qlen) sits at
      position ``context_lens[s] - qlen + i`` and attends to positions ``0..`` that one.
      A sequence with no queries is skipped; rows of q in no sequence leave ``out``
      untouched.

    Softmax in fp32 with max subtraction; scores are ``scale * q.k``. Raises
    ``RuntimeError`` on bad shapes or dtypes, a page id outside the cache, or a
    sequence with more queries than context.
    """
    ops().paged_attention(out, q, layer_cache, block_tables, context_lens, query_starts, scale)


def main() -> int:
    """Builds the extension (for scripts/setup.sh); prints where, or why it failed."""
    logging.basicConfig(level=logging.INFO)
    key = cache_key()
    if not (build_dir(key) / f"{_module_name(key)}.so").exists():
        print(f"building the native paged-attention kernels into {build_dir(key)}", file=sys.stderr)
    t0 = time.monotonic()
    try:
        build()
    except Exception as e:
        print(f"native paged-attention kernels failed to build: {e}", file=sys.stderr)
        return 1
    print(
        f"native paged-attention kernels ready in {build_dir()} "
        f"({time.monotonic() - t0:.1f} s, {vector_width()} fp32 lanes)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Keep Mooncake's own listeners off every interface but the member's address.

Mooncake 0.3.13's transfer engine (and Mooncake's current source) opens its ports on every
interface, whatever ``pool_local_hostname`` says: anyone who reaches the machine could read
and write the member's registered KV memory through them. ``csrc/confine.c`` is a small
``LD_PRELOAD`` library that rebinds the wildcard binds made from inside a Mooncake library
to one IPv4 address (its header says exactly which binds); nothing else in the process is
touched (the worker's gRPC, the router's HTTP bind where their settings say).

Lifecycle: a process that will join the pool calls :func:`confine` first thing (``kvserve
worker`` and ``kvserve router`` do, when :attr:`PoolConfig.pool_confine` is on, the
default). Unless the library is already loaded for that address, :func:`confine` builds it
on first use (the system C compiler, ``cc``; into ``<cache>/confine/``, replaced
atomically, so concurrent builders are harmless) and re-executes the process with it in
``LD_PRELOAD`` (same pid, same argv, same open files; once: a process that still lacks it
after the re-exec logs a warning and goes on). Without a C compiler, or for an address that
is not IPv4, it logs a warning and the listeners stay on every interface (firewall them;
``docs/security.md``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "csrc" / "confine.c"
ADDRESS_VARIABLE = "KVSERVE_POOL_CONFINE_ADDR"
"""Read by the library: the IPv4 address Mooncake's wildcard binds go to (internal, set by
:func:`confine` for the re-executed process; not a user setting)."""


def library_path(cache: Path) -> Path:
    """Where the library built from this source, for this machine, lives under ``cache``."""
    key = hashlib.sha256(SOURCE.read_bytes() + platform.machine().encode()).hexdigest()[:16]
    return cache / "confine" / f"confine-{key}.so"


def build(cache: Path) -> Path:
    """The library's path, compiled first when absent; RuntimeError (with the compiler's
    message) when it cannot be."""
    target = library_path(cache)
    if target.is_file():
        return target
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("no C compiler (cc) on PATH")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        built = Path(scratch) / target.name
        argv = [compiler, "-shared", "-fPIC", "-O2", "-o", str(built), str(SOURCE), "-ldl"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"cc failed: {done.stderr.strip()[-2000:]}")
        built.replace(target)
    return target


def ipv4_of(host: str) -> str | None:
    """``host``'s IPv4 address (a literal as is, a name resolved), or None."""
    try:
        return str(socket.getaddrinfo(host, None, socket.AF_INET)[0][4][0])
    except (OSError, IndexError):
        return None


def loaded(library: Path) -> bool:
    """Whether ``library`` is mapped into this process."""
    try:
        return str(library) in Path("/proc/self/maps").read_text()
    except OSError:
        return False


def confine(host: str, cache: Path) -> None:
    """Make sure this process's Mooncake listeners bind ``host`` only: returns when they
    will (or when they cannot, with a warning); otherwise re-executes the process with the
    library (and does not return)."""
    address = ipv4_of(host)
    if address is None:
        log.warning(
            "pool listeners stay on every interface: %r is not an IPv4 address (firewall "
            "the transfer-engine ports; docs/security.md)",
            host,
        )
        return
    try:
        library = build(cache)
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        log.warning("pool listeners stay on every interface: cannot build %s: %s", SOURCE, exc)
        return
    if loaded(library) and os.environ.get(ADDRESS_VARIABLE) == address:
        log.info("pool listeners confined to %s", address)
        return
    if os.environ.get(ADDRESS_VARIABLE) == address:  # re-executed, yet not loaded
        log.warning("pool listeners stay on every interface: LD_PRELOAD did not load %s", library)
        return
    env = dict(os.environ)
    env[ADDRESS_VARIABLE] = address
    env["LD_PRELOAD"] = " ".join(p for p in (str(library), env.get("LD_PRELOAD", "")) if p)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)

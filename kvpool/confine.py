"""Keep Mooncake's own listeners off every interface but the member's address, and off
every peer but the pool's members.

Mooncake 0.3.13's transfer engine (and Mooncake's current source) opens its ports on every
interface, whatever ``pool_local_hostname`` says, and serves whoever connects: its data
port writes and reads any memory registered with it (with a KV cache moved in place, the
live cache), its handshake port aborts the process on a malformed message.
``csrc/confine.c`` is a small ``LD_PRELOAD`` library that rebinds the wildcard binds made
from inside a Mooncake library to one IPv4 address, and closes each connection those
listeners accept from a peer that no rule of ``PoolConfig.pool_peers`` allows (its header
says exactly which calls and how); nothing else in the process is touched (the worker's
gRPC, the router's HTTP bind where their settings say).

Lifecycle: a process that will join the pool calls :func:`confine` first thing (``kvserve
worker`` and ``kvserve router`` do, when :attr:`PoolConfig.pool_confine` is on, the
default). Unless the library is already loaded for that address, :func:`confine` builds it
on first use (the system C compiler, ``cc``; into ``<cache>/confine/``, replaced
atomically, so concurrent builders are harmless) and re-executes the process with it in
``LD_PRELOAD`` (same pid, same argv, same open files; once: a process that still lacks it
after the re-exec logs a warning and goes on). Without a C compiler, or for an address that
is not IPv4, it logs a warning and the listeners stay on every interface, open to every
peer (firewall them; ``docs/security.md``). The pool's own services (the master, the
metadata server), which are not ``kvserve`` processes, are started with the library in
their environment instead (:func:`service_env`), where it filters every listener.
"""

from __future__ import annotations

import hashlib
import ipaddress
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
SOURCES = (SOURCE, SOURCE.with_name("peers.c"), SOURCE.with_name("peers.h"))
"""What the library is built from (the key of a build covers them all)."""
ADDRESS_VARIABLE = "KVSERVE_POOL_CONFINE_ADDR"
"""Read by the library: the IPv4 address Mooncake's wildcard binds go to (internal, set by
:func:`confine` for the re-executed process; not a user setting)."""
PEERS_VARIABLE = "KVSERVE_CONFINE_PEERS"
"""Read by the library: the peers Mooncake's listeners keep (:func:`peer_rules`; internal,
set by :func:`confine` from ``PoolConfig.pool_peers``)."""
EVERY_CALLER_VARIABLE = "KVSERVE_CONFINE_EVERY_CALLER"
"""Read by the library: ``1`` applies the peer rules to every listener of the process, not
only Mooncake's own (:func:`service_env`)."""


def parse_peers(setting: str) -> list[str] | None:
    """``PoolConfig.pool_peers`` checked: ``None`` for ``auto``, ``[]`` for ``any``, else
    its rules in the library's form (``uid:N``, ``A.B.C.D/P``); ValueError names the first
    one that is not a rule."""
    text = setting.strip()
    if text in ("auto", "any"):
        return None if text == "auto" else []
    rules = []
    for item in (part.strip() for part in text.split(",")):
        if item.startswith("uid:") and item[4:].isdigit() and int(item[4:]) < 2**32 - 1:
            rules.append(f"uid:{int(item[4:])}")
            continue
        try:
            rules.append(str(ipaddress.IPv4Network(item, strict=False)))
        except ValueError:
            raise ValueError(
                f"pool_peers: {item!r} is not uid:N or an IPv4 address or network "
                "(or say auto or any)"
            ) from None
    return rules


def peer_rules(setting: str, host: str) -> str:
    """The library's rule list for ``setting`` on a member at ``host`` (empty: every peer):
    ``auto`` is this process's user when ``host`` is a loopback address (every member runs
    on this machine, reached through loopback), else every peer."""
    rules = parse_peers(setting)
    if rules is None:
        address = ipv4_of(host)
        local = address is not None and ipaddress.IPv4Address(address).is_loopback
        rules = [f"uid:{os.getuid()}"] if local else []
    return ",".join(rules)


def library_path(cache: Path) -> Path:
    """Where the library built from this source, for this machine, lives under ``cache``."""
    parts = [path.read_bytes() for path in SOURCES] + [platform.machine().encode()]
    key = hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]
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
        units = [str(path) for path in SOURCES if path.suffix == ".c"]
        argv = [compiler, "-shared", "-fPIC", "-O2", "-o", str(built), *units, "-ldl"]
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


def preloaded(library: Path) -> str:
    """``LD_PRELOAD`` with ``library`` first, then whatever this process's says."""
    return " ".join(p for p in (str(library), os.environ.get("LD_PRELOAD", "")) if p)


def confine(host: str, cache: Path, peers: str = "auto") -> None:
    """Make sure this process's Mooncake listeners bind ``host`` only and keep only the
    peers ``peers`` (``PoolConfig.pool_peers``) allows: returns when they will (or when they
    cannot, with a warning); otherwise re-executes the process with the library (and does
    not return)."""
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
    rules = peer_rules(peers, address)  # the address resolved above: no second lookup
    wanted = {ADDRESS_VARIABLE: address, PEERS_VARIABLE: rules}
    if all(os.environ.get(k) == v for k, v in wanted.items()):
        if not loaded(library):  # re-executed, yet not loaded
            log.warning(
                "pool listeners stay on every interface, open to every peer: LD_PRELOAD did "
                "not load %s",
                library,
            )
            return
        log.info("pool listeners confined to %s, for %s", address, rules or "every peer")
        if not rules:
            log.warning(
                "the transfer engine's ports on %s serve every peer that reaches them: set "
                "pool_peers, or keep that network to the pool's members (docs/security.md)",
                address,
            )
        return
    env = {**os.environ, **wanted, "LD_PRELOAD": preloaded(library)}
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


def service_env(host: str, cache: Path) -> dict[str, str]:
    """The environment that keeps every listener of a pool service on ``host`` (the master,
    the metadata server: no ``kvserve`` process, so started with it) to the peers ``auto``
    allows there: on loopback, processes of this user. Empty where that is every peer (a
    host that is not loopback), or when the library cannot be built (a warning)."""
    rules = peer_rules("auto", host)
    if not rules:
        return {}
    try:
        library = build(cache)
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        log.warning("the pool's services serve every local user: cannot build %s: %s", SOURCE, exc)
        return {}
    return {"LD_PRELOAD": preloaded(library), PEERS_VARIABLE: rules, EVERY_CALLER_VARIABLE: "1"}

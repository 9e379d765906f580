"""One pool member in a process of its own, for tests/integration/test_pool_confine.py.

``python -m tests.integration.pool_member MASTER METADATA HOST SEGMENT_MIB CONFINE CACHE
[PEERS]`` joins the pool at ``HOST`` (first confining its Mooncake listeners there, and to
the peers ``PEERS`` allows (default ``auto``), through :func:`kvpool.confine.confine`, as
``kvserve worker`` does, when ``CONFINE`` is ``1``), prints one JSON line ``{"pid",
"listening", "segment"}`` (the addresses of its listening TCP sockets, its transfer-engine
segment name), then answers on stdin, a JSON line each:

- ``roundtrip KEY``: ``{"ok"}``, whether a value put under KEY reads back intact;
- ``peek ADDRESS N``: ``{"hex"}``, the N bytes of its memory at ADDRESS (an address of its
  registered segment).

It leaves the pool and exits when stdin closes. :func:`member` runs one from a test.
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kvpool.config import PoolConfig
from kvpool.confine import confine
from kvpool.master import MasterConfig
from kvpool.store import MooncakeStore

LISTEN = "0A"
"""The state column of a listening socket in /proc/net/tcp{,6}."""


def _address(field: str) -> str:
    """A /proc/net/tcp{,6} local address (host-order 32-bit words in hex) as text."""
    raw = bytes.fromhex(field.split(":")[0])
    address = ipaddress.ip_address(b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4)))
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return f"::ffff:{mapped}" if mapped else str(address)


def listening_on(pid: int) -> list[tuple[str, int]]:
    """The local addresses and ports of process ``pid``'s listening TCP sockets."""
    fds = Path(f"/proc/{pid}/fd")
    inodes = set()
    for fd in fds.iterdir():
        with contextlib.suppress(OSError):  # closed meanwhile
            target = str(fd.readlink())
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    found = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == LISTEN and cols[9] in inodes:
                found.append((_address(cols[1]), int(cols[1].split(":")[1], 16)))
    return sorted(found)


def listening(pid: int) -> list[str]:
    """The local addresses of process ``pid``'s listening TCP sockets."""
    return [address for address, _ in listening_on(pid)]


def main(argv: list[str]) -> int:
    master, metadata, host, segment_mib, confined, cache, *peers = argv
    logging.basicConfig(level=logging.INFO)
    if confined == "1":
        confine(host, Path(cache), *peers)
    config = PoolConfig(
        pool_master=master,
        pool_metadata_server=metadata,
        pool_local_hostname=host,
        pool_segment_mib=int(segment_mib),
        pool_local_buffer_mib=16,
    )
    store = MooncakeStore.connect(config)
    try:
        hello = {"pid": os.getpid(), "listening": listening(os.getpid())}
        print(json.dumps({**hello, "segment": store.segment()}), flush=True)
        for line in sys.stdin:
            verb, *args = line.split()
            if verb == "peek":
                seen = ctypes.string_at(int(args[0]), int(args[1]))
                print(json.dumps({"hex": seen.hex()}), flush=True)
                continue
            assert verb == "roundtrip"
            value = os.urandom(256 * 1024)
            store.put_bytes(args, [value])
            print(json.dumps({"ok": store.get_bytes(args) == [value]}), flush=True)
    finally:
        store.close()
    return 0


class Member:
    """A running member process, as a test sees it."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.hello = self._answer()

    def _answer(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"the member exited: {self.proc.communicate(timeout=30)[1][-3000:]}"
        answer: dict[str, Any] = json.loads(line)
        return answer

    def _ask(self, line: str) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{line}\n")
        self.proc.stdin.flush()
        return self._answer()

    def roundtrip(self, key: str) -> bool:
        return bool(self._ask(f"roundtrip {key}")["ok"])

    def peek(self, address: int, n: int) -> bytes:
        return bytes.fromhex(self._ask(f"peek {address} {n}")["hex"])


@contextmanager
def member(
    master: MasterConfig,
    host: str,
    segment_mib: int,
    confined: bool,
    cache: Path,
    peers: str = "auto",
) -> Iterator[Member]:
    """A member at ``host`` (see the module docstring); it leaves and exits on exit."""
    argv = [sys.executable, "-m", "tests.integration.pool_member", master.rpc_address]
    argv += [master.metadata_url, host, str(segment_mib), "1" if confined else "0", str(cache)]
    with subprocess.Popen(
        [*argv, peers],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            yield Member(proc)
        finally:
            proc.communicate(timeout=60)  # closes stdin: the member leaves and exits


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

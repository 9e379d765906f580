"""One pool member in a process of its own, for tests/integration/test_pool_confine.py.

``python -m tests.integration.pool_member MASTER METADATA HOST SEGMENT_MIB CONFINE CACHE``
joins the pool at ``HOST`` (first confining its Mooncake listeners there through
:func:`kvpool.confine.confine`, as ``kvserve worker`` does, when ``CONFINE`` is ``1``),
prints one JSON line ``{"pid", "listening"}`` (the addresses of its listening TCP sockets),
then answers each line ``roundtrip KEY`` on stdin with a JSON line ``{"ok"}``: whether a
value put under KEY reads back intact. It leaves the pool and exits when stdin closes.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import sys
from pathlib import Path

from kvpool.config import PoolConfig
from kvpool.confine import confine
from kvpool.store import MooncakeStore

LISTEN = "0A"
"""The state column of a listening socket in /proc/net/tcp{,6}."""


def _address(field: str) -> str:
    """A /proc/net/tcp{,6} local address (host-order 32-bit words in hex) as text."""
    raw = bytes.fromhex(field.split(":")[0])
    address = ipaddress.ip_address(b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4)))
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return f"::ffff:{mapped}" if mapped else str(address)


def listening(pid: int) -> list[str]:
    """The local addresses of process ``pid``'s listening TCP sockets."""
    fds = Path(f"/proc/{pid}/fd")
    inodes = set()
    for fd in fds.iterdir():
        target = str(fd.readlink()) if fd.is_symlink() else ""
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == LISTEN and cols[9] in inodes:
                found.append(_address(cols[1]))
    return sorted(found)


def main(argv: list[str]) -> int:
    master, metadata, host, segment_mib, confined, cache = argv
    logging.basicConfig(level=logging.INFO)
    if confined == "1":
        confine(host, Path(cache))
    config = PoolConfig(
        pool_master=master,
        pool_metadata_server=metadata,
        pool_local_hostname=host,
        pool_segment_mib=int(segment_mib),
        pool_local_buffer_mib=16,
    )
    store = MooncakeStore.connect(config)
    try:
        print(json.dumps({"pid": os.getpid(), "listening": listening(os.getpid())}), flush=True)
        for line in sys.stdin:
            verb, key = line.split()
            assert verb == "roundtrip"
            value = os.urandom(256 * 1024)
            store.put_bytes([key], [value])
            print(json.dumps({"ok": store.get_bytes([key]) == [value]}), flush=True)
    finally:
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

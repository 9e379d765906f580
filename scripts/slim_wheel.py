"""Rewrite a wheel in place without the members matching the given patterns (and their
RECORD lines): ``python scripts/slim_wheel.py WHEEL PATTERN...`` (``fnmatch`` patterns over
member paths). Used by ``scripts/gpu_wheels.sh`` to leave out of Mooncake's CUDA build the
binaries kvserve never loads."""

from __future__ import annotations

import fnmatch
import sys
import zipfile
from pathlib import Path


def slim(wheel: Path, patterns: list[str]) -> list[str]:
    """Drop matching members; return their names."""
    partial = wheel.with_name(wheel.name + ".partial")
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(partial, "w") as out:
        names = [i.filename for i in source.infolist()]
        dropped = [n for n in names if any(fnmatch.fnmatch(n, p) for p in patterns)]
        for info in source.infolist():
            if info.filename in dropped:
                continue
            data = source.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines()
                kept = [line for line in lines if line.split(",", 1)[0] not in dropped]
                data = ("\n".join(kept) + "\n").encode()
            out.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
    partial.replace(wheel)
    return dropped


if __name__ == "__main__":
    gone = slim(Path(sys.argv[1]), sys.argv[2:])
    print(f"{sys.argv[1]}: left out {len(gone)} members", file=sys.stderr)

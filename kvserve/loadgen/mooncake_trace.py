"""The Mooncake trace format, read once for every tool that replays it.

A trace is JSON lines ``{"timestamp": ms, "input_length": n, "output_length": m,
"hash_ids": [...]}`` (``kvserve/loadgen/data/README.md``): one hash id per block of the
prompt, equal ids at the same position meaning the whole prefix up to there is identical;
gzip-compressed when the name ends in ``.gz``. The project ships the trace published with
the Mooncake paper (:data:`SHIPPED`), the default of every tool that replays a trace.
``kvserve bench serve`` turns the ids into token blocks; ``kvserve bench trace`` into pool
keys. Pure: no I/O beyond :func:`load_trace`.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

SHIPPED = Path(__file__).parent / "data" / "mooncake_synthetic_trace.jsonl.gz"
"""Mooncake's FAST'25 synthetic trace (3,993 requests, 512-token blocks; Apache-2.0)."""


@dataclass(frozen=True)
class TraceEntry:
    """One trace line. ``timestamp_ms``: arrival from the trace start; ``output_length``
    is 0 when the line has none (prefix replays do not need it)."""

    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


E = TypeVar("E", bound=TraceEntry)


def parse_trace(
    lines: Iterable[str],
    max_requests: int | None = None,
    entry: Callable[[float, int, int, tuple[int, ...]], E] = TraceEntry,  # type: ignore[assignment]
) -> list[E]:
    """Entries of the non-blank ``lines``, in file order, at most ``max_requests``, built by
    ``entry`` (a subclass may validate more). A bad line raises ``ValueError`` naming it."""
    out: list[E] = []
    for number, line in enumerate(lines, 1):
        if max_requests is not None and len(out) >= max_requests:
            break
        if not line.strip():
            continue
        try:
            row: dict[str, Any] = json.loads(line)
            out.append(
                entry(
                    float(row["timestamp"]),
                    int(row["input_length"]),
                    int(row.get("output_length", 0)),
                    tuple(int(i) for i in row["hash_ids"]),
                )
            )
        except (KeyError, TypeError, json.JSONDecodeError, ValueError) as exc:
            raise ValueError(f"trace line {number}: {exc}") from exc
    return out


def load_trace(
    path: Path,
    max_requests: int | None = None,
    entry: Callable[[float, int, int, tuple[int, ...]], E] = TraceEntry,  # type: ignore[assignment]
) -> list[E]:
    """The entries of the trace file at ``path`` (plain or ``.gz``), as :func:`parse_trace`."""
    with gzip.open(path, "rt") if path.suffix == ".gz" else path.open() as f:
        return parse_trace(f, max_requests, entry)

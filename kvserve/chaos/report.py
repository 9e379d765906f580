"""The results of ``kvserve chaos``: the figures (:func:`summarize`) and their table.

A request is *lost with its router* when it failed on a router that a ``kill-router`` fault
killed (its ``upstream`` is that router's address) and failed as a cut connection does: the
connection broke, or the balancer answered 502 for it. Only these are counted apart from
the failed requests: a client of a killed router loses its connection, which no server
can hand over; any other failure is a failure."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from kvserve.chaos.load import Outcome

MUST_BE_ZERO = ("hung", "wrong_tokens", "pages_leaked")
CUT = ("APIConnectionError", "RemoteProtocolError", "ReadError", "HTTP 502")
"""How a request cut by its router's death ends (:class:`~kvserve.chaos.load.Outcome`'s
``detail``: the start of it)."""


@dataclass
class FaultRecord:
    kind: str
    target: str
    at_s: float
    detected_s: float | None = None
    recovered_s: float | None = None
    address: str = ""
    """A killed router's ``host:port`` ('' for other faults)."""


def _times(values: list[float | None]) -> str:
    seen = [v for v in values if v is not None]
    if not seen:
        return "-"
    return f"median {statistics.median(seen):.2f} s, max {max(seen):.2f} s ({len(seen)})"


def summarize(
    outcomes: list[Outcome | None],
    references: list[str],
    migrated: int,
    leaked: dict[str, int],
    records: list[FaultRecord],
    ties: frozenset[int] = frozenset(),
) -> dict[str, object]:
    """The results table's figures (see the module docstring). ``ties``: indices of the
    answers that differ from the reference only through floating-point ties (checked
    by :mod:`kvserve.chaos.verify`): exact, so not wrong."""
    sent = [(o, ref) for o, ref in zip(outcomes, references, strict=True) if o is not None]
    mismatched = mismatches(outcomes, references)
    ok = [(o, ref) for o, ref in sent if o.status == "ok"]
    killed = {r.address for r in records if r.address}
    errors: dict[str, int] = {}
    lost = 0
    for o, _ in sent:
        if o.status == "error" and o.upstream in killed and o.detail.startswith(CUT):
            lost += 1
        elif o.status == "error":
            errors[o.detail] = errors.get(o.detail, 0) + 1
    by_kind: dict[str, list[FaultRecord]] = {}
    for r in records:
        by_kind.setdefault(r.kind, []).append(r)
    return {
        "requests": len(sent),
        "succeeded": len(ok),
        "migrated": migrated,
        "failed_with_clear_error": sum(errors.values()),
        "lost_with_their_router": lost,
        "errors": errors,
        "hung": sum(o.status == "hung" for o, _ in sent),
        "wrong_tokens": len(mismatched) - len(ties & set(mismatched)),
        "exact_after_fp_tie": len(ties & set(mismatched)),
        "mismatches": [_diff(i, outcomes[i], references[i], i in ties) for i in mismatched],
        "pages_leaked": sum(abs(v) for v in leaked.values()),
        "leaked_by_worker": leaked,
        "faults": {
            kind: {
                "count": len(rs),
                "detection": _times([r.detected_s for r in rs]),
                "recovery": _times([r.recovered_s for r in rs]),
            }
            for kind, rs in sorted(by_kind.items())
        },
    }


def print_table(summary: dict[str, object]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="kvserve chaos")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key in ("requests", "succeeded", "migrated", "failed_with_clear_error",
                "lost_with_their_router", "hung",
                "wrong_tokens", "exact_after_fp_tie", "pages_leaked"):  # fmt: skip
        table.add_row(key.replace("_", " "), str(summary[key]))
    faults_table = Table(title="faults")
    for col in ("fault", "count", "detection", "recovery"):
        faults_table.add_column(col)
    for kind, row in summary["faults"].items():  # type: ignore[attr-defined]
        faults_table.add_row(kind, str(row["count"]), row["detection"], row["recovery"])
    console = Console()
    console.print(table)
    console.print(faults_table)
    if summary["errors"]:
        console.print(f"errors: {summary['errors']}")


def mismatches(outcomes: list[Outcome | None], references: list[str]) -> list[int]:
    """Indices of the answers that succeeded with another text than the reference."""
    return [
        i
        for i, (o, ref) in enumerate(zip(outcomes, references, strict=True))
        if o is not None and o.status == "ok" and o.text != ref
    ]


def _diff(index: int, got: Outcome | None, expected: str, tie: bool) -> dict[str, object]:
    """Where an answer departs from the reference, with some text around it."""
    assert got is not None
    at = next(
        (i for i, (a, b) in enumerate(zip(got.text, expected, strict=False)) if a != b),
        min(len(got.text), len(expected)),
    )
    return {
        "index": index,
        "exact_after_fp_tie": tie,
        "response_id": got.response_id,
        "diverges_at_char": at,
        "got": got.text[max(0, at - 20) : at + 40],
        "expected": expected[max(0, at - 20) : at + 40],
    }

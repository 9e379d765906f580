"""The schema of a worker record: what a record read from (or written to) the registry
must be, in one place.

The registry is not believed blindly: a record is a :class:`WorkerRecord` only
if every field has its type and lies within its bounds (constructing one checks them:
:meth:`WorkerRecord.__post_init__`, :func:`check_load`); anything else raises
:class:`RecordError`. Whether a record was written by a holder of the cluster secret (its
MAC) is :mod:`proto.record_store`'s part.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from proto import worker_pb2
from proto.refusals import show

ROLES = ("prefill", "decode", "mixed")

FORGED = "mac"
""":attr:`RecordError.reason` of a value with no MAC or one that does not verify."""
MALFORMED = "invalid"
""":attr:`RecordError.reason` of a value that is not a well-formed record (or contract)."""
STALE = "stale"
"""The reason a reader refuses an authentic record whose heartbeat is older than its
liveness window (:func:`proto.record_store.read_workers`): an old record put back."""

MAX_MODEL_LEN = 1 << 24
"""Bound of ``max_model_len`` (16 Mi tokens: above every model's context, 10M included)."""
MAX_LOAD_FIELDS = 64
MAX_LOAD_NUMBER = (1 << 64) - 1
"""Load report numbers are non-negative and at most uint64's range."""
TEXT_BOUNDS = {"model": 256, "model_dir": 4096, "contract": 2048}
"""Longest value (in characters) of each free-text field; every one is printable."""
INT_BOUNDS = {
    "block_tokens": (1, 4096),
    "num_layers": (1, 1024),
    "max_model_len": (1, MAX_MODEL_LEN),
}
MAX_TIMESTAMP = 1e11
"""``started_at``/``heartbeat_at`` are Unix times in [0, this] (0: a test's record)."""

_WORKER_ID = re.compile(r"[!-.0-9;-~]{1,128}")  # printable ASCII but space, ':' and '/'
_HOST = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,252}|\[[0-9A-Fa-f:.]{2,45}\]"  # name, IPv4, [IPv6]
_ADDRESS = re.compile(rf"({_HOST}):([0-9]{{1,5}})")
_DECIMAL = re.compile(r"[0-9]{1,20}")  # protobuf's JSON form of a 64-bit integer
_LOAD_KINDS = {
    f.name: ("text" if f.type == f.TYPE_STRING else "flag" if f.type == f.TYPE_BOOL else "number")
    for f in worker_pb2.LoadReport.DESCRIPTOR.fields
}
"""Each ``LoadReport`` field's kind; a field this build does not know must be a bounded
scalar (a newer worker's record still passes)."""
_LOAD_RULES = {
    "text": f"must be one of {ROLES}",
    "flag": "must be true or false",
    "number": "must be a finite number in 0..2^64-1",
    None: "an unknown field must be a flag, such a number or text of at most 256 characters",
}


class RecordError(ValueError):
    """A value read from (or about to be written to) the registry is refused; ``reason``
    is :data:`FORGED` or :data:`MALFORMED`, the message says which field and why."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def malformed(name: str, value: object, rule: str) -> RecordError:
    """The :data:`MALFORMED` error of field ``name``, which breaks ``rule``."""
    return RecordError(MALFORMED, f"{name}={show(value)}: {rule}")


def _check_int(name: str, value: object, low: int, high: int) -> None:
    if type(value) is not int or not low <= value <= high:
        raise malformed(name, value, f"must be an integer in {low}..{high}")


def check_text(name: str, value: object, longest: int) -> None:
    """Raise :class:`RecordError` unless ``value`` is printable text of 1..``longest``."""
    if not isinstance(value, str) or not 0 < len(value) <= longest or not value.isprintable():
        raise malformed(name, value, f"must be printable text of 1..{longest} characters")


def _load_number_ok(value: object) -> bool:
    """Whether ``value`` is a finite number (or a decimal string) in 0..MAX_LOAD_NUMBER."""
    if isinstance(value, str) and _DECIMAL.fullmatch(value):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return (isinstance(value, int) or math.isfinite(value)) and 0 <= value <= MAX_LOAD_NUMBER


def check_load(load: object) -> None:
    """Raise :class:`RecordError` unless ``load`` is a load report as a JSON object: at
    most :data:`MAX_LOAD_FIELDS` fields; ``role`` one of :data:`ROLES` (or empty);
    ``draining`` and other flags booleans; every number finite, non-negative and at most
    :data:`MAX_LOAD_NUMBER` (64-bit integers may be decimal strings, as protobuf's JSON
    form writes them); a field unknown to this build a flag, such a number or short text."""
    if not isinstance(load, dict) or len(load) > MAX_LOAD_FIELDS:
        raise malformed("load", load, f"must be an object of at most {MAX_LOAD_FIELDS} fields")
    for key, value in load.items():
        if not (isinstance(key, str) and key.isascii() and key.isidentifier() and len(key) <= 64):
            raise malformed("load", key, "field names are identifiers of at most 64 characters")
        kind = _LOAD_KINDS.get(key)
        if not _load_value_ok(kind, value):
            raise malformed(f"load.{key}", value, _LOAD_RULES[kind])


def _load_value_ok(kind: str | None, value: object) -> bool:
    """Whether ``value`` fits a load field of ``kind`` (None: a field this build does not
    know, which must be a flag, a number or printable text of at most 256 characters)."""
    if kind == "text":
        return isinstance(value, str) and value in ("", *ROLES)
    if kind == "flag":
        return isinstance(value, bool)
    if kind == "number" or not isinstance(value, (bool, str)):
        return _load_number_ok(value)
    return isinstance(value, bool) or (len(value) <= 256 and value.isprintable())


@dataclass(frozen=True)
class WorkerRecord:
    """What a worker tells the cluster about itself; constructing one validates it.

    ``worker_id``: 1..128 printable ASCII characters without space, ``:`` or ``/``;
    ``address``: ``host:port`` (a host name, an IPv4 address or a bracketed IPv6 one; a
    port in 1..65535); ``role``: one of :data:`ROLES`; ``model``: the served model name;
    ``model_dir``: where the worker loaded it from, on its own machine (informative only:
    the router reads its tokenizer from its own ``tokenizer_dir``, never from a path it
    read here); ``contract``: the KV contract text (namespace key and KV wire layout);
    ``block_tokens`` and ``num_layers`` let the router compute pool keys for lookups;
    ``load``: the latest load report (the fields of ``LoadReport`` in ``worker.proto``, as
    protobuf's JSON form writes them, :func:`check_load`). Texts are bounded by
    :data:`TEXT_BOUNDS`, integers by :data:`INT_BOUNDS`, times by :data:`MAX_TIMESTAMP`.
    A value outside them raises :class:`RecordError` (a ``ValueError``).
    """

    worker_id: str
    address: str
    role: str
    model: str
    model_dir: str
    contract: str
    block_tokens: int
    num_layers: int
    max_model_len: int
    started_at: float
    heartbeat_at: float
    load: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.worker_id, str) or not _WORKER_ID.fullmatch(self.worker_id):
            raise malformed(
                "worker_id", self.worker_id, "1..128 printable ASCII, no space, ':', '/'"
            )
        where = _ADDRESS.fullmatch(self.address) if isinstance(self.address, str) else None
        if where is None or not 0 < int(where.group(2)) < 65536:
            raise malformed("address", self.address, "must be host:port with a port in 1..65535")
        if self.role not in ROLES:
            raise malformed("role", self.role, f"must be one of {ROLES}")
        for name, longest in TEXT_BOUNDS.items():
            check_text(name, getattr(self, name), longest)
        for name, (low, high) in INT_BOUNDS.items():
            _check_int(name, getattr(self, name), low, high)
        for name in ("started_at", "heartbeat_at"):
            value = getattr(self, name)
            if type(value) not in (int, float) or not 0 <= value <= MAX_TIMESTAMP:
                raise malformed(name, value, f"must be a Unix time in 0..{MAX_TIMESTAMP:g}")
        check_load(self.load)

    def to_json(self) -> str:
        """The record as canonical JSON (without a MAC: see
        :func:`proto.record_store.seal_record`)."""
        return canonical(dataclasses.asdict(self))

    @classmethod
    def from_fields(cls, data: Mapping[str, object]) -> WorkerRecord:
        """The record of a decoded JSON object (fields this build does not know are
        ignored); :class:`RecordError` when a field is missing or out of bounds."""
        names = [f.name for f in dataclasses.fields(cls)]
        missing = [n for n in names if n not in data and n != "load"]
        if missing:
            raise RecordError(MALFORMED, f"fields missing: {', '.join(missing)}")
        return cls(**{n: data[n] for n in names if n in data})  # type: ignore[arg-type]


def canonical(data: object) -> str:
    """The one JSON text of ``data`` that MACs cover: sorted keys, no spaces, ASCII only
    (ValueError for NaN or infinity)."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False)

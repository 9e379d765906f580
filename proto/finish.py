"""Why a request ended: the one table from the engine's reason to the wire to OpenAI's.

A worker's engine names the reason (``workers.core.sequence.FinishReason``, a string enum whose
values are the ``engine`` column); the worker sends :attr:`Finish.wire`
(``proto/worker.proto`` ``FinishReason``) with :func:`wire_finish`; the router shows
:attr:`Finish.openai` to the client with :func:`openai_finish`. Both edges read this table
and nothing else, so a reason cannot mean one thing on the wire and another to a client.

- ``stop`` / ``length``: finished; the client sees ``"stop"`` / ``"length"``;
- ``abort``: the worker gave the request up (draining, failed, out of memory); the client
  sees no finish reason but an error (the router's 503);
- ``handoff``: prefill done on a prefill worker, decoding goes on elsewhere: on the wire it
  is "not finished" (``FINISH_REASON_UNSPECIFIED``), like a chunk without a reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from proto import worker_pb2 as pb


@dataclass(frozen=True)
class Finish:
    """One row: the engine's name, the wire value, and the OpenAI string (None: the client
    is shown none, because the request is not finished or failed)."""

    engine: str
    wire: pb.FinishReason.ValueType
    openai: str | None


FINISHES: tuple[Finish, ...] = (
    Finish("stop", pb.FINISH_REASON_STOP, "stop"),
    Finish("length", pb.FINISH_REASON_LENGTH, "length"),
    Finish("abort", pb.FINISH_REASON_ABORT, None),
    Finish("handoff", pb.FINISH_REASON_UNSPECIFIED, None),
)

_WIRE: Mapping[str, pb.FinishReason.ValueType] = {f.engine: f.wire for f in FINISHES}
_OPENAI: Mapping[pb.FinishReason.ValueType, str] = {
    f.wire: f.openai for f in FINISHES if f.openai is not None
}


def wire_finish(engine: str | None) -> pb.FinishReason.ValueType:
    """The wire value of the engine's reason (its string value); None (still running) and
    any name not in :data:`FINISHES` are "not finished" (``FINISH_REASON_UNSPECIFIED``)."""
    if engine is None:
        return pb.FINISH_REASON_UNSPECIFIED
    return _WIRE.get(engine, pb.FINISH_REASON_UNSPECIFIED)


def openai_finish(wire: pb.FinishReason.ValueType) -> str | None:
    """The ``finish_reason`` a client sees for a wire value; None for "not finished" and for
    ``FINISH_REASON_ABORT`` (the router turns that into an error, not a reason)."""
    return _OPENAI.get(wire)

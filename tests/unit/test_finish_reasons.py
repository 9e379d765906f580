"""The one finish-reason table (proto/finish.py): every engine reason has a row, and the
worker's wire value and the router's OpenAI string both come from it."""

from __future__ import annotations

from proto import worker_pb2 as pb
from proto.finish import FINISHES, openai_finish, wire_finish
from workers.core.sequence import FinishReason
from workers.serve.wire import finish_reason


def test_every_engine_reason_has_one_row() -> None:
    engines = [f.engine for f in FINISHES]
    assert sorted(engines) == sorted(r.value for r in FinishReason)
    assert len(set(engines)) == len(engines)


def test_engine_to_wire_to_openai() -> None:
    seen = {r: openai_finish(finish_reason(r)) for r in FinishReason}
    assert seen == {
        FinishReason.STOP: "stop",
        FinishReason.LENGTH: "length",
        FinishReason.ABORT: None,  # the router answers an error instead
        FinishReason.HANDOFF: None,  # not finished: decoding goes on elsewhere
    }
    assert finish_reason(FinishReason.ABORT) == pb.FINISH_REASON_ABORT
    assert finish_reason(FinishReason.HANDOFF) == pb.FINISH_REASON_UNSPECIFIED
    assert finish_reason(None) == wire_finish(None) == pb.FINISH_REASON_UNSPECIFIED
    assert wire_finish("unheard-of") == pb.FINISH_REASON_UNSPECIFIED

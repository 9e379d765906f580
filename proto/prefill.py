"""A ``Prefill`` stream read whole (``proto/worker.proto``: the first token, then, after a
push, how it went), for blocking clients such as tools and tests. The router reads the
stream message by message instead (:mod:`router.flow.run`), so as not to hold the first
token back."""

from __future__ import annotations

from collections.abc import Iterable

from proto import worker_pb2 as pb


def prefill_answer(replies: Iterable[pb.PrefillReply]) -> pb.PrefillReply:
    """The stream's messages as one reply: the first one's token, text, finish, usage and
    logprob, the ``push`` of the one that has it, every message's ``transfer`` summed.
    ValueError for a stream that ended without a message."""
    answer: pb.PrefillReply | None = None
    for reply in replies:
        if answer is None:
            answer = pb.PrefillReply()
            answer.CopyFrom(reply)
            continue
        if reply.HasField("push"):
            answer.push.CopyFrom(reply.push)
        answer.transfer.bytes += reply.transfer.bytes
        answer.transfer.seconds += reply.transfer.seconds
        answer.transfer.exposed_seconds += reply.transfer.exposed_seconds
    if answer is None:
        raise ValueError("the Prefill stream ended without a token")
    return answer

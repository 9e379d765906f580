"""The prefill half of the hand-off, as an engine's step sees it: :class:`PrefillHandoff`.

One object per engine that joined the pool. Each step calls :meth:`PrefillHandoff.plan`
once and gets the step's writes (a :class:`kvpool.stream.StepWrite`: the model hands it
each layer as it is computed, then the step finishes or abandons it), whatever carries
them. Two transports sit behind it:

- the pool (:class:`~workers.handoff.pool_transfer.KVStreamer`): every block a step
  completes, and a hand-off prompt's partial last block, written layer by layer;
- the direct push (:class:`~workers.handoff.pusher.Pusher`, only with the pool's
  configuration to open its transfer engine): for a hand-off that came with a decode
  worker's :class:`~kvpool.push.PushTarget`, each layer written into that worker's
  reserved pages as well, the pool write then running in the background.

Lifecycle: made with the engine; :meth:`accept` when a hand-off request comes with a push
target; per step :meth:`unpin` (pages the background writes no longer read), then
:meth:`plan`; on a hand-off's first token, :meth:`answered` (how its push goes: a future,
set when the prompt's last step, which may end after that token, is done; given once);
:meth:`flush` to wait for the background writes (offline use, tests); :meth:`close` at
shutdown. Engine thread only, like the engine.
"""

from __future__ import annotations

from concurrent.futures import Future

from kvpool.config import PoolConfig
from kvpool.pool import KVPool
from kvpool.push import PushOutcome, PushTarget
from kvpool.stream import StepWrite
from workers.core.block_manager import BlockManager
from workers.core.scheduler import BatchEntry
from workers.core.sequence import Sequence
from workers.handoff.pool_transfer import KVStreamer
from workers.handoff.push_state import push_state
from workers.handoff.pusher import Pusher


class PrefillHandoff:
    """The prefill half (module docstring). ``config``: the pool's configuration, which the
    direct push needs for a transfer engine of its own (None: no push, pool only);
    ``streaming``: write layer by layer (``EngineConfig.kv_streaming``; a push needs it)."""

    def __init__(
        self,
        pool: KVPool,
        config: PoolConfig | None,
        blocks: BlockManager,
        streaming: bool,
        push_after_token: bool = False,
    ) -> None:
        self.streamer = KVStreamer(pool, blocks, streaming)
        self.pusher = Pusher(pool, config, blocks, push_after_token) if config is not None else None

    def accept(self, seq: Sequence, target: PushTarget) -> None:
        """Hand-off ``seq`` came with ``target``: push its prompt there too (a worker without
        the push writes the pool only, and :meth:`answered` says nothing of a push)."""
        if self.pusher is not None:
            seq.push = self.pusher.state_for(seq, target)

    def plan(self, entries: list[BatchEntry]) -> StepWrite | None:
        """The writes of a step that computes ``entries``: the pool's, wrapped to push as
        well when the step completes blocks of a prompt with a target."""
        write = self.streamer.plan(entries)
        return write if self.pusher is None else self.pusher.plan(entries, write)

    def unpin(self) -> None:
        """Give back the pages that background pool writes pinned and no longer read."""
        if self.pusher is not None:
            self.pusher.unpin()

    def answered(self, seq: Sequence) -> Future[PushOutcome] | None:
        """How ``seq``'s push goes, on its first token: its metas when it succeeded, once
        known (the prompt's last step may still be pushing: it sets the answer then); None
        when it had no push, or was answered already (an answer is given once)."""
        state = push_state(seq)
        if state is None or self.pusher is None:
            return None
        seq.push = None
        if not state.settling:  # its steps are over: the answer is known now
            state.answer.set_result(self.pusher.outcome(state))
        return state.answer

    def flush(self) -> None:
        """Wait until every queued pool write is done (the pushes' background ones too:
        the last steps that end on kv-write hand theirs to kv-publish)."""
        self.streamer.flush()
        if self.pusher is not None:
            self.pusher.flush()

    def close(self) -> None:
        """Stop the pool writer (the pushes' last steps end there first), then the push (its
        background writes finish first)."""
        self.streamer.flush()
        if self.pusher is not None:
            self.pusher.close()
            self.pusher = None
        self.streamer.close()

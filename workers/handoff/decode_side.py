"""The decode side of a hand-off as an engine offers it: :class:`DecodeHandoff`, mixed into
:class:`workers.engine.engine.Engine`. Its methods check a request the way the engine checks any
(``_requests``, the model's vocabulary), then hand it to the engine's
:class:`~workers.handoff.reservations.Reservations`: hold pages for a prompt whose prefill runs
elsewhere (:meth:`DecodeHandoff.reserve`), offer them for a direct push
(:meth:`DecodeHandoff.push_target`), say what to wait for once the prefill answered
(:meth:`DecodeHandoff.arrived`, :mod:`workers.handoff.arrival`) and take the request over
with its first token (:meth:`DecodeHandoff.adopt`). Every method runs on the engine's
thread, like the engine's own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvpool.hashing import PrefixHasher
from kvpool.push import PushTarget
from kvpool.stream import Transfer
from workers.core.outputs import EngineStats
from workers.core.request_checks import check_params, check_token_ids
from workers.core.request_table import RequestTable
from workers.core.sequence import SamplingParams, Sequence
from workers.handoff.arrival import Arrival
from workers.handoff.push_receive import PushVerdict
from workers.handoff.reservations import Reservations
from workers.model.config import ModelConfig


class DecodeHandoff:
    """The engine's hand-off methods (module docstring); the attributes are the engine's."""

    reservations: Reservations
    hasher: PrefixHasher
    model_config: ModelConfig
    stats: EngineStats
    _requests: RequestTable

    if TYPE_CHECKING:

        def resume(
            self,
            request_id: str,
            prompt_token_ids: list[int],
            output_token_ids: list[int],
            params: SamplingParams,
            cache_salt: str = "",
        ) -> Transfer: ...

    def reserve(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        max_tokens: int,
        lease_s: float,
        cache_salt: str = "",
        offer_push: bool = False,
    ) -> Sequence | None:
        """Hold pages for a prompt whose prefill runs elsewhere (see
        :mod:`workers.handoff.reservations`); ``None`` if they are not free now, ``ValueError`` if
        the request can never fit. Released after ``lease_s`` unless :meth:`adopt` comes.
        ``offer_push``: offer the pages for a direct push (:meth:`push_target`)."""
        self._requests.check_new(request_id, prompt_token_ids)
        root = self.hasher.root(cache_salt)
        return self.reservations.reserve(
            request_id, prompt_token_ids, max_tokens, lease_s, root, offer_push
        )

    def push_target(self, request_id: str) -> PushTarget | None:
        """Where reserved ``request_id``'s prompt KV may be pushed, if it offered that."""
        return self.reservations.push_target(request_id)

    def arrived(self, request_id: str, pushed: bool) -> Arrival:
        """The remote prefill of reserved ``request_id`` answered (``pushed``: with the
        metas of a push that went through): what to wait for off this thread
        (:meth:`workers.handoff.arrival.Arrival.wait`) before :meth:`adopt`; the one call
        to the engine between the answer and the adoption."""
        return self.reservations.arrived(request_id, pushed)

    def adopt(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        first_token: int,
        params: SamplingParams,
        cache_salt: str = "",
        pushed: PushVerdict | None = None,
    ) -> Transfer:
        """Take over a request whose prefill ran elsewhere and produced ``first_token``.

        With a live reservation, the prompt's KV is pulled from the pool into its pages, or
        taken from its landing, which the caller lets finish first
        (:meth:`arrived`; what has not arrived is recomputed here); without one
        (expired, or never made) the request is queued like a new one, its prompt reused
        from the pool through admission. Returns the KV read. A take-over that raises
        leaves nothing behind: the reservation CANCELLED, its pages back, nothing tracked.
        ``pushed``: the verdict of the check of a direct push into the reservation's pages
        (made by :meth:`arrived`, run off this thread by
        :meth:`workers.handoff.arrival.Arrival.wait`;
        :meth:`workers.handoff.reservations.Reservations.adopt` credits it).
        """
        vocab = self.model_config.vocab_size
        check_token_ids([first_token], vocab, "first_token")
        check_params(params, vocab)

        def track(seq: Sequence, _: Transfer) -> None:  # part of the take-over (may raise)
            self._requests.track(seq)
            self._requests.made_elsewhere(seq, [first_token])

        try:
            adopted = self.reservations.adopt(
                request_id, prompt_token_ids, first_token, params, track, pushed
            )
        except BaseException:
            self._requests.forget(request_id)  # (not tracked before: reserve checked)
            raise
        if adopted is None:
            return self.resume(request_id, prompt_token_ids, [first_token], params, cache_salt)
        _, transfer = adopted
        self.stats.kv_read.add(transfer)
        self.stats.requests += 1
        return transfer

    def holds(self, request_id: str) -> bool:
        """Whether a reservation is held for ``request_id``."""
        return request_id in self.reservations

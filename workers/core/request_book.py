"""Per-request state an engine keeps beside the scheduler's, and what a sampled token means.

Lifecycle of one request's entry: :meth:`RequestBook.track` when the engine takes the
request -> :meth:`RequestBook.output` once per sampled token (the released text, stop
strings, EOS, stop tokens and the length limit decide whether it finishes) ->
:meth:`RequestBook.forget` when it ends, however it ends. The book never touches pages: the
engine finishes a request in its scheduler when an output says it finished.
"""

from __future__ import annotations

from kvpool.stream import Transfer
from proto.tokenization import Tokenizer
from workers.core.detokenizer import IncrementalText
from workers.core.outputs import EngineStats, RequestOutput
from workers.core.sequence import FinishReason, Sequence, TokenLogprob


class RequestBook:
    def __init__(
        self,
        tokenizer: Tokenizer,
        eos_token_ids: frozenset[int],
        max_model_len: int,
        stats: EngineStats,
    ) -> None:
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self.stats = stats
        self._texts: dict[str, IncrementalText] = {}
        self._transfers: dict[str, Transfer] = {}

    def track(self, seq: Sequence) -> None:
        """Start the entry of ``seq``."""
        p = seq.params
        self._texts[seq.request_id] = IncrementalText(self.tokenizer.stream(), p.stop, p.min_tokens)
        self._transfers[seq.request_id] = Transfer()

    def released(self, request_id: str, token_ids: list[int]) -> None:
        """Tokens the request produced elsewhere: their text counts as released already."""
        self._texts[request_id].push(token_ids)

    def forget(self, request_id: str) -> None:
        self._texts.pop(request_id, None)
        self._transfers.pop(request_id, None)

    def account(self, step: Transfer, owners: dict[str, int]) -> None:
        """Attribute a step's pool writes to its requests (bytes by share of blocks; every
        owner sees the step's full time)."""
        total = sum(owners.values())
        for request_id, count in owners.items():
            if (mine := self._transfers.get(request_id)) is not None:
                mine.add(Transfer(step.bytes * count // total, step.seconds, step.exposed_seconds))
        self.stats.kv_write.add(step)

    def output(
        self, seq: Sequence, token: int, logprob: TokenLogprob | None = None
    ) -> RequestOutput:
        """Append ``token`` (of raw logprob ``logprob``, when asked for) to ``seq`` and say
        what it released and whether it finished; the first output carries the prompt's
        logprobs, when asked for."""
        first = seq.num_output_tokens == 0
        if first:
            self.stats.prompt_tokens_cached += seq.num_cached_tokens
            self.stats.prompt_tokens_from_pool += seq.num_pool_hit_tokens
        seq.token_ids.append(token)
        texts = self._texts[seq.request_id]
        delta = texts.push([token])
        reason = FinishReason.STOP if texts.stopped else self._finish_reason(seq, token)
        if reason is None and seq.handoff:
            reason = FinishReason.HANDOFF
        text = None
        if reason is not None and reason is not FinishReason.HANDOFF:
            delta += texts.finish()
            text = texts.text
        # a hand-off releases only what the decode worker, pushing the same token, will
        # count as released: text held back for a possible stop string comes from there
        return RequestOutput(
            request_id=seq.request_id,
            prompt_token_ids=seq.token_ids[: seq.num_prompt_tokens],
            output_token_ids=seq.output_token_ids,
            new_token_ids=[token],
            finished=reason is not None,
            finish_reason=reason,
            num_cached_tokens=seq.num_cached_tokens,
            num_pool_tokens=seq.num_pool_hit_tokens,
            text=text,
            text_delta=delta,
            transfer=self._transfers.get(seq.request_id),
            logprobs=[logprob] if logprob is not None else [],
            prompt_logprobs=list(seq.prompt_logprobs)
            if first and seq.params.prompt_logprobs is not None
            else None,
        )

    @staticmethod
    def failed(seq: Sequence, error: str) -> RequestOutput:
        """The last output of a request the engine failed on alone."""
        return RequestOutput(
            request_id=seq.request_id,
            prompt_token_ids=seq.token_ids[: seq.num_prompt_tokens],
            output_token_ids=seq.output_token_ids,
            new_token_ids=[],
            finished=True,
            finish_reason=FinishReason.ABORT,
            error=error,
        )

    def _finish_reason(self, seq: Sequence, token: int) -> FinishReason | None:
        p = seq.params
        if token in p.stop_token_ids or (not p.ignore_eos and token in self.eos_token_ids):
            return FinishReason.STOP
        if seq.num_output_tokens >= p.max_tokens or seq.num_tokens >= self.max_model_len:
            return FinishReason.LENGTH
        return None

"""Conversions between the engine's types and the messages of ``proto/worker.proto``."""

from __future__ import annotations

from collections.abc import Iterable

from kvpool.push import PushOutcome, PushTarget
from kvpool.stream import Transfer
from proto import worker_pb2 as pb
from proto.finish import wire_finish
from proto.limits import logit_bias_count_error, stop_count_error, stop_token_ids_count_error
from workers.core.engine_info import EngineLoad
from workers.core.outputs import RequestOutput
from workers.core.sequence import FinishReason, SamplingParams, TokenLogprob


def sampling_params(msg: pb.SamplingParams) -> SamplingParams:
    """The engine's params (``ValueError`` with the offending field if invalid).

    The repeated and map fields' counts are checked before they are copied into tuples and
    dicts, so an oversized message is refused without building them. Zero ``top_p`` and an
    unset ``repetition_penalty`` are off (1)."""
    if error := (
        stop_count_error(len(msg.stop))
        or stop_token_ids_count_error(len(msg.stop_token_ids))
        or logit_bias_count_error(len(msg.logit_bias))
    ):
        raise ValueError(error)
    return SamplingParams(
        max_tokens=msg.max_tokens,
        temperature=msg.temperature,
        top_p=msg.top_p if msg.top_p > 0 else 1.0,
        top_k=msg.top_k,
        seed=msg.seed if msg.HasField("seed") else None,
        stop=tuple(msg.stop),
        stop_token_ids=tuple(msg.stop_token_ids),
        ignore_eos=msg.ignore_eos,
        logit_bias=dict(msg.logit_bias),
        presence_penalty=msg.presence_penalty,
        frequency_penalty=msg.frequency_penalty,
        repetition_penalty=msg.repetition_penalty if msg.HasField("repetition_penalty") else 1.0,
        min_tokens=msg.min_tokens,
        logprobs=msg.logprobs if msg.HasField("logprobs") else None,
        prompt_logprobs=msg.prompt_logprobs if msg.HasField("prompt_logprobs") else None,
    )


def logprobs(items: Iterable[TokenLogprob]) -> list[pb.TokenLogprob]:
    """The wire form of tokens' logprobs."""
    return [
        pb.TokenLogprob(logprob=lp.logprob, top_ids=lp.top_ids, top_logprobs=lp.top_logprobs)
        for lp in items
    ]


def finish_reason(reason: FinishReason | None) -> pb.FinishReason.ValueType:
    """The wire value, from :data:`proto.finish.FINISHES`; a hand-off (prefill done,
    decoding elsewhere) is "not finished"."""
    return wire_finish(None if reason is None else reason.value)


def usage(out: RequestOutput) -> pb.PromptUsage:
    """Where the prompt's tokens came from. A resumed request also reuses output tokens
    made elsewhere; only the prompt's share is counted here."""
    prompt = len(out.prompt_token_ids)
    cached = min(out.num_cached_tokens, prompt)
    pool = min(out.num_pool_tokens, cached)
    return pb.PromptUsage(
        prompt_tokens=prompt,
        local_tokens=cached - pool,
        pool_tokens=pool,
        computed_tokens=prompt - cached,
    )


def token_chunk(out: RequestOutput) -> pb.TokenChunk:
    """One ``Generate`` chunk of an engine output (without the first chunk's usage and
    transfer, which the servicer adds)."""
    return pb.TokenChunk(
        token_ids=out.new_token_ids,
        text=out.text_delta,
        finish_reason=finish_reason(out.finish_reason),
        logprobs=logprobs(out.logprobs),
        prompt_logprobs=logprobs(out.prompt_logprobs or ()),
    )


def prefill_reply(out: RequestOutput) -> pb.PrefillReply:
    """A ``Prefill``'s first answer: the first token's output (its text, finish, usage, the
    KV written, its logprob)."""
    return pb.PrefillReply(
        first_token=out.new_token_ids[0],
        text=out.text_delta,
        finish_reason=finish_reason(out.finish_reason),
        usage=usage(out),
        transfer=transfer(out.transfer),
        logprob=logprobs(out.logprobs)[0] if out.logprobs else None,
    )


def push_reply(outcome: PushOutcome) -> pb.PrefillReply:
    """A ``Prefill``'s second answer: how its push went, and the KV it moved after the first."""
    moved = Transfer(outcome.bytes, outcome.seconds)
    return pb.PrefillReply(push=push_result(outcome), transfer=transfer(moved))


def transfer(t: Transfer | None) -> pb.Transfer:
    if t is None:
        return pb.Transfer()
    return pb.Transfer(bytes=t.bytes, seconds=t.seconds, exposed_seconds=t.exposed_seconds)


def push_target_msg(target: PushTarget) -> pb.PushTarget:
    return pb.PushTarget(
        segment=target.segment,
        wire=target.wire,
        slab_address=target.slab_address,
        num_blocks=target.num_blocks,
        first_block=target.first_block,
        pages=target.pages,
        lease_ms=round(target.lease_s * 1000),
        mac=target.mac,
        issued_ms=target.issued_ms,
    )


def push_target(msg: pb.PushTarget, num_prompt_tokens: int) -> PushTarget:
    """The engine's target from a ``PrefillRequest``'s; it is checked in full before any
    write (:func:`kvpool.push.target_error`). A page list longer than the prompt is not even
    copied (the target then has none, which fails that check)."""
    pages = tuple(msg.pages) if len(msg.pages) <= num_prompt_tokens else ()
    return PushTarget(
        segment=msg.segment,
        wire=msg.wire,
        slab_address=msg.slab_address,
        num_blocks=msg.num_blocks,
        first_block=msg.first_block,
        pages=pages,
        lease_s=msg.lease_ms / 1000,
        issued_ms=msg.issued_ms,
        mac=msg.mac,
    )


def push_result(outcome: PushOutcome) -> pb.PushResult:
    return pb.PushResult(ok=outcome.ok, metas=outcome.metas, error=outcome.error)


def load_report(load: EngineLoad, role: str, draining: bool) -> pb.LoadReport:
    """The wire form of an engine's load snapshot (``Engine.load``) for a worker in
    ``role``."""
    s = load.stats
    return pb.LoadReport(
        role=role,
        draining=draining,
        waiting=load.waiting,
        running=load.running,
        reserved=load.reserved,
        queued_prefill_tokens=load.queued_prefill_tokens,
        free_pages=load.free_pages,
        total_pages=load.total_pages,
        prefill_tokens_per_s=s.prompt_tokens_computed / s.prefill_seconds
        if s.prefill_seconds
        else 0.0,
        decode_tokens_per_s=s.decode_step_tokens / s.decode_steps_seconds
        if s.decode_steps_seconds
        else 0.0,
        prompt_tokens_local=s.prompt_tokens_cached - s.prompt_tokens_from_pool,
        prompt_tokens_pool=s.prompt_tokens_from_pool,
        prompt_tokens_computed=s.prompt_tokens_computed,
        output_tokens=s.output_tokens,
        kv_bytes_written=s.kv_write.bytes,
        kv_bytes_read=s.kv_read.bytes,
        kv_write_seconds=s.kv_write.seconds,
        kv_read_seconds=s.kv_read.seconds,
        kv_exposed_seconds=s.kv_write.exposed_seconds,
        requests=s.requests,
        pool_connected=load.pool.connected,
        pool_outages=load.pool.outages,
        pool_forged_blocks=load.pool.forged_blocks,
        pool_checksum_failures=load.pool.checksum_failures,
        pool_evicted_blocks=load.pool.eviction.evicted_blocks,
        pool_refused_blocks=load.pool.eviction.refused_blocks,
        pool_orphans_removed=load.pool.eviction.orphans_removed,
        pool_healed_blocks=load.pool.healed_blocks,
        pool_index_errors=load.pool.eviction.index_errors,
        pool_dram_objects=load.pool.tiers.dram_objects,
        pool_ssd_objects=load.pool.tiers.ssd_objects,
        pool_dram_read_seconds=load.pool.tiers.dram_read_seconds,
        pool_ssd_read_seconds=load.pool.tiers.ssd_read_seconds,
        pool_reads_given_up=load.pool.reads_given_up,
        pool_objects_skipped=load.pool.objects_skipped,
    )

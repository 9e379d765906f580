"""``logit_bias``, ``min_tokens`` and the penalties end to end on the tiny model: greedy
tokens against transformers' ``generate`` with the same processors, batches against single
requests, a hand-off and a resume against a run on one engine, and the gRPC entrance
refusing what the router refuses."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList, SequenceBiasLogitsProcessor

from kvpool.master import MasterConfig
from kvserve.bench.handoff import handoff
from proto import worker_pb2 as pb
from tests.integration.reference import hf_model
from tests.integration.test_exactness import make_engine, random_prompts
from tests.integration.test_handoff import make_engine as make_pool_engine
from tests.integration.test_handoff import master  # noqa: F401  (a fixture)
from tests.integration.worker_harness import serving_worker
from tests.unit.test_router_openai_models import PROCESSING_CASES
from workers.config import EngineConfig
from workers.core.outputs import RequestOutput
from workers.core.sequence import FinishReason, SamplingParams
from workers.engine import engine as engine_module
from workers.engine.engine import Engine

VOCAB = 49152
(REPEATING,) = random_prompts((8,), seed=24)
"""A prompt after which the tiny (random) model repeats a token within 12 greedy tokens."""


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Iterator[Engine]:
    engine = make_engine(tiny_model_dir)
    yield engine
    engine.close()


@pytest.fixture
def eos(engine: Engine) -> Iterator[None]:
    """Puts the engine's EOS ids back after a test that changed them."""
    book, runner = engine.book.eos_token_ids, engine.runner.eos_token_ids
    yield
    engine.book.eos_token_ids, engine.runner.eos_token_ids = book, runner


def greedy(max_tokens: int, **fields: Any) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, **fields)


class OpenAIPenalties(LogitsProcessor):  # type: ignore[misc]
    """OpenAI's formula over the output tokens (those after ``prompt``), for ``generate``."""

    def __init__(self, prompt: int, frequency: float, presence: float) -> None:
        self.prompt, self.frequency, self.presence = prompt, frequency, presence

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        counts = torch.zeros_like(scores)
        outputs = input_ids[:, self.prompt :]
        counts.scatter_add_(1, outputs, torch.ones_like(outputs, dtype=scores.dtype))
        penalty = self.frequency * counts + self.presence * (counts > 0).to(scores.dtype)
        return scores - penalty  # type: ignore[return-value]


@torch.inference_mode()
def hf_generate(
    model_dir: Path, prompt: list[int], max_new_tokens: int, **kwargs: Any
) -> list[int]:
    """transformers' greedy ``generate`` of one prompt with ``kwargs`` (EOS ignored unless
    ``eos_token_id`` is given)."""
    ids = torch.tensor([prompt])
    kwargs.setdefault("eos_token_id", None)
    out = hf_model(model_dir).generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=0,
        **kwargs,
    )
    return [int(t) for t in out[0, len(prompt) :]]


def one(engine: Engine, prompt: list[int], params: SamplingParams) -> RequestOutput:
    (out,) = engine.generate([prompt], params)
    return out


def test_a_bias_of_100_makes_greedy_and_sampled_output_that_token(engine: Engine) -> None:
    (prompt,) = random_prompts((10,), seed=21)
    plain = one(engine, prompt, greedy(5)).output_token_ids
    token = next(t for t in range(100, VOCAB) if t not in plain)
    for params in (
        greedy(5, logit_bias={token: 100.0}),
        SamplingParams(
            max_tokens=5, temperature=1.0, seed=3, ignore_eos=True, logit_bias={token: 100}
        ),
    ):
        assert one(engine, prompt, params).output_token_ids == [token] * 5
    banned = one(engine, prompt, greedy(5, logit_bias={plain[0]: -100.0})).output_token_ids
    assert banned[0] != plain[0]


def test_logit_bias_is_transformers_sequence_bias(engine: Engine, tiny_model_dir: Path) -> None:
    (prompt,) = random_prompts((14,), seed=22)
    plain = one(engine, prompt, greedy(6)).output_token_ids
    bias = {plain[1]: -4.0, plain[3]: -6.5, 777: 9.0}
    ours = one(engine, prompt, greedy(6, logit_bias=bias)).output_token_ids
    processor = SequenceBiasLogitsProcessor([[[t], b] for t, b in bias.items()])
    reference = hf_generate(tiny_model_dir, prompt, 6, logits_processor=[processor])
    assert ours == reference != plain


@pytest.mark.parametrize("penalty", [1.8, 0.6])
def test_repetition_penalty_is_transformers(
    engine: Engine, tiny_model_dir: Path, penalty: float
) -> None:
    prompt = REPEATING
    ours = one(engine, prompt, greedy(12, repetition_penalty=penalty)).output_token_ids
    assert ours == hf_generate(tiny_model_dir, prompt, 12, repetition_penalty=penalty)
    assert ours != one(engine, prompt, greedy(12)).output_token_ids


def test_presence_and_frequency_follow_openais_formula(
    engine: Engine, tiny_model_dir: Path
) -> None:
    """The tiny model repeats itself; the penalties make it stop, as the formula says."""
    prompt = REPEATING
    for frequency, presence in ((1.5, 0.0), (0.0, 2.0), (0.5, -0.5)):
        params = greedy(12, frequency_penalty=frequency, presence_penalty=presence)
        ours = one(engine, prompt, params).output_token_ids
        penalties = OpenAIPenalties(len(prompt), frequency, presence)
        reference = hf_generate(
            tiny_model_dir, prompt, 12, logits_processor=LogitsProcessorList([penalties])
        )
        assert ours == reference, (frequency, presence)
    plain = one(engine, prompt, greedy(12)).output_token_ids
    assert len(set(plain)) < len(plain), "the prompt no longer makes the model repeat itself"
    assert len(set(one(engine, prompt, greedy(12, presence_penalty=2.0)).output_token_ids)) > len(
        set(plain)
    )


def test_min_tokens_holds_eos_back_as_transformers(
    engine: Engine, tiny_model_dir: Path, eos: None
) -> None:
    """EOS-heavy: every token the model would say first is an EOS."""
    (prompt,) = random_prompts((9,), seed=25)
    likely = one(engine, prompt, greedy(12)).output_token_ids
    engine.book.eos_token_ids = engine.runner.eos_token_ids = frozenset(likely)
    unheld = one(engine, prompt, SamplingParams(max_tokens=12, temperature=0))
    assert unheld.output_token_ids == likely[:1] and unheld.finish_reason is FinishReason.STOP
    params = SamplingParams(max_tokens=12, temperature=0, min_tokens=5)
    held = one(engine, prompt, params).output_token_ids
    reference = hf_generate(
        tiny_model_dir, prompt, 12, min_new_tokens=5, eos_token_id=sorted(likely)
    )
    assert held == reference
    assert len(held) > 5 and not set(held[:5]) & set(likely)


def test_min_tokens_holds_the_models_own_eos_back(engine: Engine) -> None:
    """The engine hands the runner its EOS ids: a biased EOS waits for min_tokens."""
    (prompt,) = random_prompts((10,), seed=31)
    eos = min(engine.book.eos_token_ids)
    forced = {"temperature": 0, "max_tokens": 8, "logit_bias": {eos: 100.0}}
    assert one(engine, prompt, SamplingParams(**forced)).output_token_ids == [eos]  # type: ignore[arg-type]
    held = one(engine, prompt, SamplingParams(**forced, min_tokens=3))  # type: ignore[arg-type]
    assert len(held.output_token_ids) == 4 and held.output_token_ids[3] == eos
    assert eos not in held.output_token_ids[:3] and held.finish_reason is FinishReason.STOP


def test_min_tokens_holds_stop_token_ids_back(engine: Engine) -> None:
    (prompt,) = random_prompts((11,), seed=26)
    plain = one(engine, prompt, greedy(8)).output_token_ids
    stop = (plain[0], plain[1])
    early = one(engine, prompt, greedy(8, stop_token_ids=stop))
    assert early.output_token_ids == plain[:1]
    late = one(engine, prompt, greedy(8, stop_token_ids=stop, min_tokens=3)).output_token_ids
    assert not set(late[:3]) & set(stop)


def test_min_tokens_defers_stop_strings(engine: Engine) -> None:
    """vLLM's rule: no stop-string check before min_tokens outputs exist."""
    (prompt,) = random_prompts((12,), seed=13)
    plain = one(engine, prompt, greedy(10))
    assert plain.text is not None
    first = engine.tokenizer.decode(plain.output_token_ids[:1]).strip()
    assert first and plain.text.count(first) == 1, "pick a prompt whose first word is unique"
    stopped = one(engine, prompt, greedy(10, stop=(first,)))
    assert stopped.finish_reason is FinishReason.STOP and len(stopped.output_token_ids) == 1
    checked_at_once = one(engine, prompt, greedy(10, stop=(first,), min_tokens=1))
    assert checked_at_once.output_token_ids == stopped.output_token_ids
    deferred = one(engine, prompt, greedy(10, stop=(first,), min_tokens=2))
    assert deferred.finish_reason is FinishReason.LENGTH
    assert deferred.output_token_ids == plain.output_token_ids and deferred.text == plain.text


MIXED = [
    greedy(8),
    greedy(8, repetition_penalty=1.4),
    greedy(8, frequency_penalty=1.0, presence_penalty=0.5, logit_bias={5: 3.0}),
    SamplingParams(max_tokens=8, temperature=0.9, seed=11, presence_penalty=1.5),
    SamplingParams(max_tokens=8, temperature=0.8, seed=12, ignore_eos=True),
    SamplingParams(max_tokens=8, temperature=0, min_tokens=8, repetition_penalty=0.7),
]


def test_a_batch_of_mixed_requests_equals_each_alone(engine: Engine) -> None:
    prompts = random_prompts((7, 20, 13, 9, 30, 16), seed=27)
    together = engine.generate(prompts, list(MIXED))
    for prompt, params, out in zip(prompts, MIXED, together, strict=True):
        assert out.output_token_ids == one(engine, prompt, params).output_token_ids, params


def test_a_resumed_request_goes_on_as_if_it_had_run_here(engine: Engine) -> None:
    """The outputs made elsewhere count as output history (penalties, min_tokens)."""
    (prompt,) = random_prompts((15,), seed=28)
    params = SamplingParams(
        max_tokens=10, temperature=0, frequency_penalty=2.0, repetition_penalty=1.2, min_tokens=9
    )
    whole = one(engine, prompt, params).output_token_ids
    engine.resume("resumed", prompt, whole[:4], params)
    rest: list[int] = []
    while engine.has_unfinished:
        rest += [t for out in engine.step() for t in out.new_token_ids]
    assert whole[:4] + rest == whole


def test_a_resumed_request_defers_stop_strings_alike(engine: Engine) -> None:
    """Outputs made elsewhere replay into the text as they were checked there: a stop
    string in the unchecked first tokens does not end the resumed request."""
    (prompt,) = random_prompts((12,), seed=13)
    plain = one(engine, prompt, greedy(10)).output_token_ids
    first = engine.tokenizer.decode(plain[:1]).strip()
    params = greedy(10, stop=(first,), min_tokens=2)
    whole = one(engine, prompt, params)
    engine.resume("resumed-stop", prompt, whole.output_token_ids[:4], params)
    rest: list[int] = []
    while engine.has_unfinished:
        rest += [t for out in engine.step() for t in out.new_token_ids]
    assert whole.output_token_ids[:4] + rest == whole.output_token_ids == plain


def test_a_handed_off_request_is_processed_as_on_one_worker(
    tiny_model_dir: Path,
    master: MasterConfig,  # noqa: F811
) -> None:
    prefill = make_pool_engine(tiny_model_dir, master, streaming=True)
    decode = make_pool_engine(tiny_model_dir, master, streaming=True)
    try:
        (ids,) = random_prompts((40,), seed=29)
        for i, params in enumerate(MIXED[1:4]):
            (colocated,) = prefill.generate([ids], params)
            out = handoff(prefill, decode, f"processed-{i}", ids, params)
            assert out.output_token_ids == colocated.output_token_ids, params
    finally:
        prefill.close()
        decode.close()


def test_the_engine_refuses_a_bias_outside_its_vocabulary(engine: Engine) -> None:
    with pytest.raises(ValueError, match=r"logit_bias token ids must be in \[0, 49152\)"):
        engine.add_request([1, 2, 3], greedy(2, logit_bias={VOCAB: 1.0}))
    assert not engine.has_unfinished


def test_a_failing_processor_fails_its_request_alone(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bias the engine did not check (patched out) breaks processing of its row only: the
    batch is processed and sampled again row by row, and the rest get their tokens."""
    prompts = random_prompts((9, 14, 11), seed=30)
    params = [MIXED[1], MIXED[3], MIXED[2]]
    clean = engine.generate(prompts, params)
    monkeypatch.setattr(engine_module, "check_params", lambda params, vocab: None)
    broken = greedy(8, logit_bias={VOCAB + 5: 1.0})
    outs = engine.generate(prompts, [params[0], broken, params[2]])
    assert outs[1].finish_reason is FinishReason.ABORT and outs[1].error
    for i in (0, 2):
        assert outs[i].error is None and outs[i].output_token_ids == clean[i].output_token_ids
    assert engine.num_free_blocks == engine.num_blocks


def wire(fields: dict[str, Any]) -> pb.SamplingParams:
    """A router test case as a worker's caller sends it."""
    msg = pb.SamplingParams(max_tokens=fields.get("max_tokens", 16), temperature=0)
    for name, value in fields.items():
        if name == "logit_bias":
            msg.logit_bias.update({int(k): v for k, v in value.items()})
        elif name == "stop_token_ids":
            msg.stop_token_ids.extend(value)
        elif name != "max_tokens":
            setattr(msg, name, value)
    return msg


def carried(fields: dict[str, Any]) -> bool:
    """Whether the wire can carry the case (token ids are uint32)."""
    return all(0 <= int(k) < 1 << 32 for k in fields.get("logit_bias", {}))


def test_the_grpc_entrance_refuses_what_the_router_refuses(tiny_model_dir: Path) -> None:
    """The router's table (tests/unit/test_router_openai_models.py), sent to a served worker:
    what the router refuses is INVALID_ARGUMENT here; the rest is served, but for token ids
    past this model's vocabulary, which only a worker knows (the router answers 400 too)."""
    config = EngineConfig(model=str(tiny_model_dir), block_tokens=16, kv_cache_mib=16, threads=1)
    with serving_worker(config) as worker:
        for i, (fields, valid) in enumerate(PROCESSING_CASES):
            if not carried(fields):
                continue
            in_vocab = all(int(k) < VOCAB for k in fields.get("logit_bias", {}))
            request = pb.GenerateRequest(
                request_id=f"case-{i}", prompt_token_ids=[1, 2, 3], params=wire(fields)
            )
            try:
                chunks = list(worker.stub.Generate(request, timeout=60))
            except grpc.RpcError as exc:
                assert not (valid and in_vocab), (fields, exc.details())
                assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, fields
                assert next(iter(fields)) in (exc.details() or ""), (fields, exc.details())
            else:
                assert valid and in_vocab, fields
                assert chunks[-1].finish_reason != pb.FINISH_REASON_UNSPECIFIED
        assert worker.idle()

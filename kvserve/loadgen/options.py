"""The settings of ``kvserve bench serve`` (:data:`SETTINGS`; the load's, :data:`LOAD_SETTINGS`,
are shared with ``bench compare``, ``sim serve`` and ``sim validate``) and what they build:
the workload and its conditions.

Every length, rate, scale and seed is a setting, and :func:`workload_conditions` records each
one that shaped the run in the JSON's ``conditions``.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

from kvserve.loadgen.arrivals import PROCESSES
from kvserve.loadgen.conversation import (
    ConversationPlan,
    ConversationShape,
    conversation_plans,
    first_turns,
)
from kvserve.loadgen.mooncake_trace import SHIPPED, load_trace
from kvserve.loadgen.slo import AbsoluteSlo, SloTargets
from kvserve.loadgen.workloads import (
    DEFAULT_VOCAB,
    SYNTHETIC_KINDS,
    Lengths,
    RequestSpec,
    SyntheticShape,
    TraceOptions,
    shared_prefix_requests,
    synthetic_requests,
    trace_requests,
)
from kvserve.settings import BENCH_ENV, add_config_args, setting
from router.config import RouterConfig

CONVERSATION = "conversation"
WORKLOADS = (*SYNTHETIC_KINDS, "shared-prefix", "trace", CONVERSATION)
DEFAULT_REQUESTS = 48


@dataclass(frozen=True)
class ServerConfig:
    """The server ``kvserve bench serve`` loads.

    - ``url``: server base URL;
    - ``model``: model name to ask for (default: the first of /v1/models).
    """

    env_prefix: ClassVar[str] = BENCH_ENV
    url: str = f"http://{RouterConfig.router_host}:{RouterConfig.router_port}"
    model: str = ""


@dataclass(frozen=True)
class WorkloadConfig:
    """The requests of a serving benchmark (bench serve, bench compare, sim serve, sim
    validate).

    - ``workload``: the kind of requests (conversation: multi-turn, sent as token ids);
    - ``num_requests``: requests per rate (0: 48; for trace: the first N, 0 = all; not for
      conversation: --conversations);
    - ``seed``: seed of the requests and arrivals;
    - ``vocab``: token ids in [100, vocab);
    - ``spread``: lengths uniform in mean*(1±s);
    - ``prefill_heavy_input`` / ``prefill_heavy_output``: prefill-heavy mean prompt and
      output tokens;
    - ``decode_heavy_input`` / ``decode_heavy_output``: decode-heavy mean prompt and output
      tokens;
    - ``prefix_groups``: shared-prefix: groups G;
    - ``prefix_len``: shared-prefix: prefix tokens P;
    - ``suffix_len``: shared-prefix: unique suffix;
    - ``prefix_output_len``: shared-prefix: output;
    - ``trace``: Mooncake trace, JSON lines, plain or .gz (default: the shipped Mooncake
      trace);
    - ``trace_block_size``: trace: tokens per hash id;
    - ``length_scale``: trace: prompt lengths x;
    - ``output_scale``: trace: output lengths x;
    - ``output_cap``: trace: output cap (0: none);
    - ``conversations``: conversation: conversations per rate (they start at the rate);
    - ``turns``: conversation: turns per conversation;
    - ``first_prompt_len``: conversation: first message tokens;
    - ``user_message_len``: conversation: tokens of each later turn's new user message;
    - ``answer_len``: conversation: max_tokens of each answer;
    - ``think_s``: conversation: seconds between an answer and the next turn (± spread).
    """

    env_prefix: ClassVar[str] = BENCH_ENV
    workload: str = setting("mixed", choices=WORKLOADS)
    num_requests: int = setting(0, aliases=("--max-requests",))
    seed: int = 0
    vocab: int = DEFAULT_VOCAB
    spread: float = 0.25
    prefill_heavy_input: int = 512
    prefill_heavy_output: int = 16
    decode_heavy_input: int = 64
    decode_heavy_output: int = 128
    prefix_groups: int = 4
    prefix_len: int = 256
    suffix_len: int = 32
    prefix_output_len: int = 16
    trace: Path = SHIPPED
    trace_block_size: int = 512
    length_scale: float = 1.0
    output_scale: float = 1.0
    output_cap: int = 0
    conversations: int = 12
    turns: int = 3
    first_prompt_len: int = 256
    user_message_len: int = 48
    answer_len: int = 32
    think_s: float = 1.0


@dataclass(frozen=True)
class LoadConfig:
    """How a serving benchmark sends its requests.

    - ``arrival``: arrival process (default: trace for the trace workload, else poisson);
    - ``rates``: request rates to sweep (req/s, 'inf' = all at once); trace arrivals are
      rescaled to each rate (default: trace timing, or inf);
    - ``burstiness_cv``: gamma: CV of gaps;
    - ``time_scale``: trace timestamps x;
    - ``concurrency``: requests in flight cap (0: none);
    - ``warmup``: warm-up requests (not counted);
    - ``timeout_s``: per-request timeout;
    - ``prompt_format``: send token ids or text (conversation: always token ids);
    - ``tokenizer``: text prompts: HF tokenizer to decode with;
    - ``ignore_eos``: generate every output token asked for.
    """

    env_prefix: ClassVar[str] = BENCH_ENV
    arrival: str | None = setting(None, choices=PROCESSES)
    rates: list[float] | None = None
    burstiness_cv: float = 1.0
    time_scale: float = 1.0
    concurrency: int = 0
    warmup: int = 2
    timeout_s: float = 300.0
    prompt_format: str = setting("ids", choices=("ids", "text"))
    tokenizer: str = ""
    ignore_eos: bool = True


@dataclass(frozen=True)
class ReportConfig:
    """What a serving benchmark reports: SLOs, goodput, buckets, labels, files.

    - ``slo_ttft_s``: absolute SLO on time to first token;
    - ``slo_tpot_s``: absolute SLO on time per output token;
    - ``slo_tbt_s``: absolute SLO on time between tokens;
    - ``slo_relative``: targets = factor x median unloaded TTFT/TBT per input-length bucket;
    - ``calibration_requests``: unloaded requests per bucket for --slo-relative;
    - ``goodput_threshold``: SLO attainment a rate needs to count for goodput;
    - ``input_buckets`` / ``output_buckets``: bucket bounds of prompt and output lengths;
    - ``deployment``: labels of the deployment in the JSON;
    - ``out``: folder for the JSON and PNG plots;
    - ``progress``: show a progress bar.
    """

    env_prefix: ClassVar[str] = BENCH_ENV
    slo_ttft_s: float | None = None
    slo_tpot_s: float | None = None
    slo_tbt_s: float | None = None
    slo_relative: tuple[float, float] | None = setting(None, metavar=("TTFT_FACTOR", "TBT_FACTOR"))
    calibration_requests: int = 8
    goodput_threshold: float = 0.9
    input_buckets: list[int] = setting([128, 512, 2048])
    output_buckets: list[int] = setting([32, 128])
    deployment: list[str] = setting([], nargs="*", metavar="KEY=VALUE")
    out: Path | None = None
    progress: bool = True


LOAD_SETTINGS = (WorkloadConfig, LoadConfig, ReportConfig)
"""The serving load's settings, shared by every tool that sends it."""
SETTINGS = (ServerConfig, *LOAD_SETTINGS)
"""Every setting of ``kvserve bench serve``."""


def add_load_settings(parser: argparse.ArgumentParser) -> None:
    """The flags of :data:`LOAD_SETTINGS` (one group each)."""
    for cls in LOAD_SETTINGS:
        add_config_args(parser, cls)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Every flag of ``kvserve bench serve``."""
    for cls in SETTINGS:
        add_config_args(parser, cls)


@dataclass(frozen=True)
class Workload:
    """The requests of one rate (arrivals unset unless replayed from a trace); for the
    conversation workload, its ``conversations`` and, as ``specs``, their first turns (for
    warm-up and SLO calibration)."""

    specs: list[RequestSpec]
    conditions: dict[str, Any]
    conversations: list[ConversationPlan] | None = None


def build_workload(args: argparse.Namespace) -> Workload:
    """The workload the flags describe, with the conditions that shaped it."""
    if args.workload == CONVERSATION:
        return conversation_workload(args)
    n, spread = args.num_requests or DEFAULT_REQUESTS, args.spread
    if args.workload in SYNTHETIC_KINDS:
        shapes = {
            "prefill-heavy": SyntheticShape(
                Lengths(args.prefill_heavy_input, spread),
                Lengths(args.prefill_heavy_output, spread),
            ),
            "decode-heavy": SyntheticShape(
                Lengths(args.decode_heavy_input, spread), Lengths(args.decode_heavy_output, spread)
            ),
        }
        specs = synthetic_requests(args.workload, n, args.seed, shapes, args.vocab)
        return Workload(specs, {"shapes": {k: asdict(v) for k, v in shapes.items()}})
    if args.workload == "shared-prefix":
        suffix, output = Lengths(args.suffix_len, spread), Lengths(args.prefix_output_len, spread)
        specs = shared_prefix_requests(
            n, args.seed, args.prefix_groups, args.prefix_len, suffix, output, args.vocab
        )
        return Workload(
            specs,
            {
                "groups": args.prefix_groups,
                "prefix_len": args.prefix_len,
                "suffix": asdict(suffix),
                "output": asdict(output),
            },
        )
    opts = TraceOptions(
        args.trace_block_size,
        args.length_scale,
        args.output_scale,
        args.output_cap,
        args.num_requests,
    )
    specs = trace_requests(load_trace(args.trace), args.seed, opts, args.vocab)
    return Workload(
        specs, {"trace": str(args.trace), **asdict(opts), "time_scale": args.time_scale}
    )


def conversation_workload(args: argparse.Namespace) -> Workload:
    """The conversation workload (:mod:`kvserve.loadgen.conversation`) of the flags."""
    if args.num_requests:
        raise ValueError("the conversation workload is sized by --conversations and --turns")
    first, user, answer = (
        Lengths(n, args.spread)
        for n in (args.first_prompt_len, args.user_message_len, args.answer_len)
    )
    shape = ConversationShape(args.turns, first, user, answer, args.think_s, args.spread)
    plans = conversation_plans(args.conversations, args.seed, shape, args.vocab)
    conditions = {"conversations": args.conversations, **asdict(shape)}
    return Workload(first_turns(plans), conditions, plans)


def prompt_format(args: argparse.Namespace) -> str:
    """How prompts travel: ``--prompt-format``, but always token ids for conversations (each
    turn's prompt holds the previous answer's ids as the server returned them:
    :mod:`kvserve.loadgen.conversation_client`)."""
    return "ids" if args.workload == CONVERSATION else str(args.prompt_format)


def arrival_process(args: argparse.Namespace) -> str:
    return str(args.arrival or ("trace" if args.workload == "trace" else "poisson"))


def rates(args: argparse.Namespace) -> list[float | None]:
    """The rates to run: the flags', or one run (None: trace timing; else inf)."""
    if args.rates:
        return list(args.rates)
    return [None] if arrival_process(args) == "trace" else [math.inf]


def absolute_slo(args: argparse.Namespace) -> AbsoluteSlo | None:
    targets = SloTargets(args.slo_ttft_s, args.slo_tpot_s, args.slo_tbt_s)
    return AbsoluteSlo(targets) if targets != SloTargets() else None


def deployment_labels(pairs: list[str]) -> dict[str, str]:
    labels = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--deployment takes KEY=VALUE pairs, got {pair!r}")
        labels[key] = value
    return labels


def json_rate(rate: float | None) -> float | str | None:
    """A rate as JSON can carry it (``"inf"`` for all at once)."""
    return "inf" if rate is not None and math.isinf(rate) else rate

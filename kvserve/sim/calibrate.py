"""``kvserve sim calibrate``: fit a :class:`~kvserve.sim.costs.LinearCost` to our own engine.

1. The real :class:`workers.engine.engine.Engine` is loaded with the given settings (default: the
   worker's, one thread, pinned to one core, as ``kvserve up`` runs a worker on a core);
2. scripted scenarios run to completion, each a few requests added at given steps: single
   prompts of several lengths, one long prompt in chunks (attention over a growing context),
   decode batches of several sizes and contexts, and long prompts joining running decodes
   (mixed steps); every step's :class:`~kvserve.sim.costs.StepShape` (taken from the batch
   the scheduler built) and wall time are recorded;
3. :meth:`LinearCost.fit` fits the coefficients (non-negative least squares) and the fit's
   own error is reported; ``--output`` receives the cost file that ``kvserve sim serve
   --cost`` reads (``{"kind": "linear", "coefficients": ..., "model": ...}``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from kvserve.report import base_conditions, emit, log
from kvserve.settings import add_config_args, config_from_args, setting
from kvserve.sim import SIM_ENV
from kvserve.sim.costs import LinearCost, StepShape
from kvserve.sim.engine import shape_of
from kvserve.sim.modelshape import from_hf_config
from workers.config import EngineConfig


@dataclass(frozen=True)
class Scenario:
    """Requests ``(prompt_len, max_tokens, add_at_step)`` run together to completion."""

    name: str
    requests: tuple[tuple[int, int, int], ...]


def scenarios(max_prompt: int) -> list[Scenario]:
    """The default script: prefill sizes, chunked context, decode batches, mixed steps."""
    longest = min(max_prompt, 1536)
    out = [Scenario(f"prefill {n}", ((n, 1, 0),)) for n in (16, 64, 128, 256, 384, 512)]
    out.append(Scenario(f"chunked {longest}", ((longest, 1, 0),)))
    for batch, context in ((1, 64), (2, 64), (4, 64), (8, 64), (16, 64), (4, 512), (8, 512)):
        out.append(
            Scenario(f"decode {batch}x{context}", tuple((context, 12, 0) for _ in range(batch)))
        )
    for batch in (4, 12):
        decodes = tuple((64, 24, 0) for _ in range(batch))
        out.append(Scenario(f"mixed {batch}+448", (*decodes, (448, 1, 4))))
    return out


def measure(engine: Any, scenario: Scenario, vocab: int) -> list[tuple[StepShape, float]]:
    """Run ``scenario`` on ``engine``; ``(shape, seconds)`` of each of its steps."""
    from workers.core.sequence import SamplingParams

    shapes: list[StepShape] = []
    schedule = engine.scheduler.schedule

    def recording() -> Any:
        batch = schedule()
        if batch:
            shapes.append(shape_of(batch))
        return batch

    setattr(engine.scheduler, "schedule", recording)  # noqa: B010 (instrumenting one instance)
    samples: list[tuple[StepShape, float]] = []
    pending = sorted(enumerate(scenario.requests), key=lambda item: item[1][2])
    step = 0
    try:
        while pending or engine.has_unfinished:
            while pending and pending[0][1][2] <= step:
                i, (length, max_tokens, _) = pending.pop(0)
                prompt = [100 + (i * 7919 + 31 * j + step) % (vocab - 100) for j in range(length)]
                params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
                engine.add_request(prompt, params)
            before = len(shapes)
            t0 = time.perf_counter()
            engine.step()
            elapsed = time.perf_counter() - t0
            if len(shapes) > before:
                samples.append((shapes[-1], elapsed))
            step += 1
    finally:
        setattr(engine.scheduler, "schedule", schedule)  # noqa: B010
    return samples


def read_step_logs(paths: list[Path], skip: int = 2) -> list[tuple[StepShape, float]]:
    """The samples of step logs (``workers.core.step_log``: files, or folders of
    ``steps-*.jsonl``), leaving out each file's first ``skip`` steps (warm-up)."""
    files = [f for p in paths for f in (sorted(p.glob("steps-*.jsonl")) if p.is_dir() else [p])]
    samples: list[tuple[StepShape, float]] = []
    for path in files:
        lines = path.read_text().splitlines()[skip:]
        for line in lines:
            entry = json.loads(line)
            prefill = tuple((int(n), int(c)) for n, c in entry["prefill"])
            shape = StepShape(prefill=prefill, decode=tuple(int(c) for c in entry["decode"]))
            samples.append((shape, float(entry["seconds"])))
    if not samples:
        raise ValueError(f"no steps in {', '.join(map(str, paths))}")
    return samples


@dataclass(frozen=True)
class CalibrateConfig:
    """What ``kvserve sim calibrate`` fits and where it writes.

    - ``output``: the cost file to write;
    - ``from_step_logs``: fit on steps logged by workers in service (--step-log-dir)
      instead of running the engine here;
    - ``repeat``: runs of the whole script;
    - ``pin``: core to pin to (-1: no pinning).
    """

    env_prefix: ClassVar[str] = SIM_ENV
    output: Path = setting()
    from_step_logs: list[Path] | None = None
    repeat: int = 2
    pin: int = 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The calibration's settings and the engine's (one thread unless set)."""
    add_config_args(parser, CalibrateConfig)
    add_config_args(parser, EngineConfig, defaults={"threads": 1})


def run_scenarios(
    args: argparse.Namespace, config: EngineConfig
) -> tuple[list[tuple[StepShape, float]], list[dict[str, Any]]]:
    """Steps 1-2 of the module docstring: samples, and a row per scenario run."""
    from workers.engine.engine import Engine

    if args.pin >= 0:
        os.sched_setaffinity(0, {args.pin})
    engine = Engine(config)
    vocab = engine.model_config.vocab_size
    log(f"sim calibrate: warming up {engine.model_dir.name}")
    measure(engine, Scenario("warm-up", ((128, 4, 0), (64, 4, 0))), vocab)
    samples: list[tuple[StepShape, float]] = []
    rows: list[dict[str, Any]] = []
    for r in range(args.repeat):
        for scenario in scenarios(engine.max_model_len):
            got = measure(engine, scenario, vocab)
            samples += got
            seconds = sum(s for _, s in got)
            rows.append({"repeat": r, "scenario": scenario.name, "steps": len(got),
                         "seconds": seconds})  # fmt: skip
            log(f"sim calibrate: {scenario.name}: {len(got)} steps")
    engine.close()
    return samples, rows


def run(args: argparse.Namespace) -> int:
    from workers.model.prepare import resolve_model_dir

    config = config_from_args(EngineConfig, args)
    model_dir = resolve_model_dir(config.model)
    shape = from_hf_config(json.loads((model_dir / "config.json").read_text()), model_dir.name)
    if args.from_step_logs:
        samples = read_step_logs(args.from_step_logs)
        rows: list[dict[str, Any]] = [{"step_logs": [str(p) for p in args.from_step_logs]}]
    else:
        samples, rows = run_scenarios(args, config)
    cost = LinearCost.fit(samples, allow_unused=bool(args.from_step_logs))
    report = cost.fit_report(samples)
    conditions = {
        **base_conditions(),
        "model": model_dir.name,
        "source": "step logs" if args.from_step_logs else "scripted scenarios",
        "engine": dict(vars(config)),
        "pinned_core": args.pin,
        "samples": len(samples),
    }
    dtype_bytes = {"float32": 4}.get(config.dtype, 2)
    payload = {
        **cost.to_json(),
        "model_shape": dataclasses.asdict(shape),
        "dtype_bytes": dtype_bytes,
        "fit": report,
        "conditions": conditions,
        "samples": [[list(map(list, sh.prefill)), list(sh.decode), sec] for sh, sec in samples],
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(payload, indent=2) + "\n")
    log(f"sim calibrate: wrote {args.output}")
    headline = {
        "metric": "median relative error of the fitted step time",
        "value": report.get("median_rel_error"),
        "baseline": None,
        "ratio": None,
        "target": None,
    }
    emit("sim calibrate", conditions, [*rows, {**cost.to_json(), "fit": report}], headline)
    return 0

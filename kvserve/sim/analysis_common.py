"""What the cost analyses (``sim crossover``, ``sim hidden``) share: their settings for a
hardware/model/cost (:class:`CostConfig`), and the step times of one chunked prefill.

The cost is the roofline of ``--hardware`` and ``--model`` on ``--tp`` devices unless
``--cost FILE`` names a calibrated :class:`~kvserve.sim.costs.LinearCost` (which carries
its model's shape and dtype). :func:`resolve_cost` is also the simulator's
(:mod:`kvserve.sim.deploy`).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from kvserve.sim import SIM_ENV
from kvserve.sim.costs import RooflineCost, StepCost, StepShape, load_cost
from kvserve.sim.modelshape import ModelShape

GB = 1e9


@dataclass(frozen=True)
class CostConfig:
    """The cost of an analysis: a hardware's roofline for a model, or a calibrated file.

    - ``hardware``: profile: a100, h100, h200, cpu;
    - ``model``: preset (llama3-8b, ...) or a model directory;
    - ``tp``: tensor parallel degree (roofline);
    - ``cost``: a calibrated LinearCost JSON file instead of the hardware's roofline;
    - ``latency_us``: one-way link latency;
    - ``out``: folder for the PNG plot.
    """

    env_prefix: ClassVar[str] = SIM_ENV
    hardware: str = "h100"
    model: str = "llama3-8b"
    tp: int = 1
    cost: Path | None = None
    latency_us: float = 10.0
    out: Path | None = None


@dataclass(frozen=True)
class CostSetup:
    """The cost of one engine step, the model it prices, the bytes of one KV element and
    (roofline costs) the device memory, for sizing a KV cache."""

    cost: StepCost
    model: ModelShape
    dtype_bytes: int
    memory_bytes: float | None
    cost_name: str

    def kv_bytes(self, tokens: int) -> int:
        """KV bytes of ``tokens`` tokens (all layers)."""
        return tokens * self.model.kv_bytes_per_token(self.dtype_bytes)

    def conditions(self) -> dict[str, Any]:
        return {
            "cost": self.cost_name,
            "model": self.model.name,
            "layers": self.model.layers,
            "params": self.model.params,
            "dtype_bytes": self.dtype_bytes,
            "kv_bytes_per_token": self.kv_bytes(1),
        }


def resolve_cost(spec: str, tp: int = 1) -> CostSetup:
    """``roofline:HARDWARE:MODEL`` on ``tp`` devices, or a file from ``kvserve sim
    calibrate`` (which carries its model's shape and dtype)."""
    cost = load_cost(spec, tp)
    if isinstance(cost, RooflineCost):
        hw = cost.hardware
        name = spec + (f" tp={tp}" if tp > 1 else "")
        return CostSetup(cost, cost.model, hw.dtype_bytes, hw.mem_bytes * tp, name)
    data = json.loads(Path(spec).expanduser().read_text())
    if "model_shape" not in data:
        raise ValueError(f"cost file {spec} lacks model_shape: write it with kvserve sim calibrate")
    return CostSetup(
        cost, ModelShape(**data["model_shape"]), int(data.get("dtype_bytes", 4)), None, spec
    )


def cost_setup(args: argparse.Namespace) -> CostSetup:
    """The :class:`CostSetup` the flags of :class:`CostConfig` describe."""
    if args.cost is not None:
        return resolve_cost(str(args.cost))
    return resolve_cost(f"roofline:{args.hardware}:{args.model}", args.tp)


def chunk_shapes(
    prompt_len: int, chunk_tokens: int, decode: tuple[int, ...] = ()
) -> list[StepShape]:
    """The steps of prefilling ``prompt_len`` tokens ``chunk_tokens`` at a time (0: all in
    one step), each also carrying the ``decode`` batch (its contexts held fixed)."""
    if prompt_len < 1 or chunk_tokens < 0:
        raise ValueError(
            f"need prompt_len >= 1 and chunk_tokens >= 0, got {prompt_len}, {chunk_tokens}"
        )
    step = chunk_tokens or prompt_len
    return [
        StepShape(prefill=((min(step, prompt_len - done), done),), decode=decode)
        for done in range(0, prompt_len, step)
    ]


def steps_s(cost: StepCost, shapes: list[StepShape]) -> list[float]:
    return [cost.step_s(shape) for shape in shapes]

"""What the cost analyses (``sim crossover``, ``sim hidden``) share: their flags for a
hardware/model/cost, and the step times of one chunked prefill.

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
from typing import Any

from kvserve.sim.costs import RooflineCost, StepCost, StepShape, load_cost
from kvserve.sim.modelshape import ModelShape

GB = 1e9


def add_cost_arguments(parser: argparse.ArgumentParser) -> None:
    """``--hardware --model --tp --cost --latency-us --out``."""
    parser.add_argument("--hardware", default="h100", help="profile: a100, h100, h200, cpu")
    parser.add_argument(
        "--model", default="llama3-8b", help="preset (llama3-8b, ...) or a model directory"
    )
    parser.add_argument("--tp", type=int, default=1, help="tensor parallel degree (roofline)")
    parser.add_argument(
        "--cost",
        type=Path,
        default=None,
        help="a calibrated LinearCost JSON file instead of the hardware's roofline",
    )
    parser.add_argument("--latency-us", type=float, default=10.0, help="one-way link latency")
    parser.add_argument("--out", type=Path, default=None, help="folder for the PNG plot")


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
    """The :class:`CostSetup` the flags of :func:`add_cost_arguments` describe."""
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

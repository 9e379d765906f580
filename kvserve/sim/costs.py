"""Per-step cost models of one engine instance: how long one forward step of a batch takes.

A step is described by a :class:`StepShape` (which sequences prefill how many tokens on top
of how much cached context, which decode at which context) and priced by a :class:`StepCost`:

- :class:`RooflineCost`: from a :class:`~kvserve.sim.hardware.HardwareProfile` and a
  :class:`~kvserve.sim.modelshape.ModelShape`; for hardware we do not have;
- :class:`LinearCost`: a linear model fitted (non-negative least squares) on step times
  measured on our own workers; the accurate path where it was calibrated.

:func:`load_cost` builds either from one string (``roofline:HARDWARE:MODEL`` or the path of
a calibrated JSON file written from :meth:`LinearCost.to_json`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from kvserve.sim.hardware import HardwareProfile, profile
from kvserve.sim.modelshape import ModelShape, load_shape
from kvserve.sim.nnls import Array, nnls


@dataclass(frozen=True)
class StepShape:
    """One engine step's batch.

    ``prefill``: per prefilling sequence ``(new tokens this step, tokens already in its KV
    before this step)``; ``decode``: per decoding sequence, the tokens already in its KV.
    Every sequence produces one row of logits (a chunk that does not finish its prompt
    samples nothing, but engines that batch logits per sequence pay about the same).
    """

    prefill: tuple[tuple[int, int], ...] = ()
    decode: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for new, context in self.prefill:
            if new < 1 or context < 0:
                raise ValueError(
                    f"prefill entry (new={new}, context={context}): need new >= 1 and context >= 0"
                )
        if any(context < 0 for context in self.decode):
            raise ValueError(f"decode contexts must be >= 0, got {self.decode}")

    @property
    def prefill_tokens(self) -> int:
        return sum(new for new, _ in self.prefill)

    @property
    def prefill_attention(self) -> float:
        """``sum(new * (context + new / 2))``: the causal attention work of the prefills,
        in query-key pairs (up to the diagonal's ``new / 2``)."""
        return float(sum(new * (context + new / 2) for new, context in self.prefill))

    @property
    def decode_seqs(self) -> int:
        return len(self.decode)

    @property
    def decode_context(self) -> int:
        return sum(self.decode)

    @property
    def num_tokens(self) -> int:
        """Tokens through the model this step: prefill tokens plus one per decode."""
        return self.prefill_tokens + self.decode_seqs

    @property
    def num_seqs(self) -> int:
        return len(self.prefill) + self.decode_seqs


class StepCost(Protocol):
    def step_s(self, shape: StepShape) -> float:
        """Seconds of one engine step: the forward of the whole batch plus sampling. An
        empty shape is no step and costs 0."""
        ...


@dataclass(frozen=True)
class RooflineCost:
    """A roofline per kind of operator, summed: ``step_s = overhead + max(linear compute,
    weight reads) + max(attention compute, KV traffic)`` on ``tp`` devices.

    - linear: ``num_tokens x layer FLOPs/token + num_seqs x lm-head FLOPs`` against reading
      every matmul weight once;
    - attention: :meth:`ModelShape.attention_flops` (decodes: 1 new token on their context)
      against the KV bytes every sequence reads (its context, all layers) and writes (its
      new tokens).

    The two run one after the other (separate kernels), so a decode batch riding along a
    compute-bound prefill chunk adds its KV reads instead of hiding inside the chunk's
    compute: that is the interference a colocated prefill suffers. FLOPs go at ``tp x peak x
    flops_efficiency``, bytes at ``tp x mem_bw x bw_efficiency``. Tensor parallelism divides
    both evenly (weights and KV heads sharded); its all-reduces and activation traffic are
    not modelled, nor kernel inefficiency at tiny batches beyond the fixed overhead.
    """

    hardware: HardwareProfile
    model: ModelShape
    tp: int = 1

    def __post_init__(self) -> None:
        if self.tp < 1:
            raise ValueError(f"tensor parallel degree tp must be >= 1, got {self.tp}")

    def flops(self, shape: StepShape) -> float:
        m = self.model
        attention = sum(m.attention_flops(new, ctx) for new, ctx in shape.prefill)
        attention += sum(m.attention_flops(1, ctx) for ctx in shape.decode)
        linear = shape.num_tokens * m.layer_flops_per_token + shape.num_seqs * m.lm_head_flops
        return float(linear + attention)

    def bytes_moved(self, shape: StepShape) -> float:
        kv_token = self.model.kv_bytes_per_token(self.hardware.dtype_bytes)
        context = sum(ctx for _, ctx in shape.prefill) + shape.decode_context
        weights = self.model.matmul_params * self.hardware.dtype_bytes
        return float(weights + kv_token * (context + shape.num_tokens))

    def compute_s(self, shape: StepShape) -> float:
        return self.flops(shape) / (self.tp * self.hardware.flops)

    def memory_s(self, shape: StepShape) -> float:
        return self.bytes_moved(shape) / (self.tp * self.hardware.bandwidth)

    def step_s(self, shape: StepShape) -> float:
        if shape.num_seqs == 0:
            return 0.0
        m, hw, tp = self.model, self.hardware, self.tp
        linear_flops = shape.num_tokens * m.layer_flops_per_token + shape.num_seqs * m.lm_head_flops
        weights = m.matmul_params * hw.dtype_bytes
        attention_flops = self.flops(shape) - linear_flops
        kv_bytes = self.bytes_moved(shape) - weights
        linear = max(linear_flops / (tp * hw.flops), weights / (tp * hw.bandwidth))
        attention = max(attention_flops / (tp * hw.flops), kv_bytes / (tp * hw.bandwidth))
        return hw.step_overhead_s + linear + attention


def _features(shape: StepShape) -> tuple[float, ...]:
    """The regressors of :class:`LinearCost`, in its field order."""
    return (
        1.0,
        float(shape.prefill_tokens),
        shape.prefill_attention,
        float(shape.decode_seqs),
        float(shape.decode_context),
    )


RARE_SHARE = 0.05
"""``LinearCost.fit(allow_unused=True)``: a regressor exercised by fewer samples is unused."""


@dataclass(frozen=True)
class LinearCost:
    """``step_s = fixed_s + per_prefill_token_s x prefill tokens + per_prefill_attention_s x
    sum(new x (context + new/2)) + per_decode_seq_s x decodes + per_decode_context_s x
    sum(decode context)``; every coefficient >= 0 (seconds per unit)."""

    fixed_s: float
    per_prefill_token_s: float
    per_prefill_attention_s: float
    per_decode_seq_s: float
    per_decode_context_s: float

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"LinearCost.{field.name} must be finite and >= 0, got {value}")

    def coefficients(self) -> dict[str, float]:
        return {field.name: float(getattr(self, field.name)) for field in fields(self)}

    def step_s(self, shape: StepShape) -> float:
        if shape.num_seqs == 0:
            return 0.0
        values = self.coefficients().values()
        return float(sum(c * x for c, x in zip(values, _features(shape), strict=True)))

    @classmethod
    def fit(
        cls, samples: Sequence[tuple[StepShape, float]], allow_unused: bool = False
    ) -> LinearCost:
        """Non-negative least squares over measured ``(shape, seconds)`` samples. Raises
        ValueError if the samples leave a coefficient undetermined (a regressor never
        varies, or two are proportional) or a time is not positive. ``allow_unused``: a
        regressor the samples (almost) never exercise gets 0: a prefill worker never
        decodes, and a decode worker's rare local prefill says nothing about prefill cost;
        one exercised by under :data:`RARE_SHARE` of the samples is dropped with them."""
        names = [field.name for field in fields(cls)]
        x, y = _design(samples, len(names))
        if allow_unused:
            rare = (x != 0).mean(axis=0) < RARE_SHARE
            keep_rows = ~((x[:, rare] != 0).any(axis=1))
            x, y = x[keep_rows], y[keep_rows]
        unused = [name for name, col in zip(names, x.T, strict=True) if not col.any()]
        if unused and allow_unused:
            keep = [i for i, name in enumerate(names) if name not in unused]
            sub = _fit_columns(x[:, keep], y, [names[i] for i in keep])
            full = dict.fromkeys(names, 0.0) | dict(zip([names[i] for i in keep], sub, strict=True))
            return cls(**full)
        if unused:
            raise ValueError(
                f"the samples never exercise {', '.join(unused)}: include steps with prefill "
                "(at several lengths and contexts) and steps with decodes (several batch "
                "sizes and contexts)"
            )
        return cls(*_fit_columns(x, y, names))

    def fit_report(self, samples: Sequence[tuple[StepShape, float]]) -> dict[str, Any]:
        """How well this cost reproduces ``samples``: R^2 and the median and max relative
        error ``|predicted - measured| / measured``."""
        _, y = _design(samples, 1)
        pred = np.array([self.step_s(shape) for shape, _ in samples])
        residual = float(np.sum((pred - y) ** 2))
        total = float(np.sum((y - y.mean()) ** 2))
        rel = np.abs(pred - y) / y
        return {
            "samples": len(y),
            "r2": 1.0 - residual / total if total > 0 else float(residual == 0),
            "median_rel_error": float(np.median(rel)),
            "max_rel_error": float(np.max(rel)),
        }

    def to_json(self) -> dict[str, Any]:
        return {"kind": "linear", "coefficients": self.coefficients()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LinearCost:
        """The inverse of :meth:`to_json` (other top-level keys, e.g. a fit report, are
        ignored)."""
        if data.get("kind") != "linear":
            raise ValueError(f"cost JSON kind is {data.get('kind')!r}, expected 'linear'")
        coefficients = data.get("coefficients")
        names = {field.name for field in fields(cls)}
        if not isinstance(coefficients, dict) or set(coefficients) != names:
            got = sorted(coefficients) if isinstance(coefficients, dict) else coefficients
            raise ValueError(f"cost JSON coefficients must be exactly {sorted(names)}, got {got}")
        return cls(**{name: float(value) for name, value in coefficients.items()})


def _fit_columns(
    x: np.ndarray[Any, np.dtype[np.float64]],
    y: np.ndarray[Any, np.dtype[np.float64]],
    names: list[str],
) -> list[float]:
    """Non-negative least squares of ``y`` on the columns of ``x`` (named ``names``, for
    the error when they are not independent)."""
    scale = np.linalg.norm(x, axis=0)
    rank = int(np.linalg.matrix_rank(x / scale))
    if rank < len(names):
        raise ValueError(
            f"the samples determine only {rank} of the {len(names)} coefficients "
            f"({', '.join(names)}): some regressors are proportional across all samples; "
            "vary batch sizes, prompt lengths and contexts independently"
        )
    return [float(c) for c in nnls(x / scale, y) / scale]


def _design(samples: Sequence[tuple[StepShape, float]], need: int) -> tuple[Array, Array]:
    """The feature matrix and the times of ``samples`` (at least ``need``, times > 0)."""
    if len(samples) < need:
        raise ValueError(f"need at least {need} samples, got {len(samples)}")
    y = np.array([seconds for _, seconds in samples], dtype=float)
    if not (np.isfinite(y).all() and (y > 0).all()):
        raise ValueError("every sample's step time must be finite and > 0")
    x = np.array([_features(shape) for shape, _ in samples], dtype=float)
    return x, y


def load_cost(spec: str, tp: int = 1) -> StepCost:
    """``roofline:HARDWARE:MODEL`` (a profile name and a model preset or directory) on
    ``tp`` devices, or the path of a calibrated JSON file (:meth:`LinearCost.to_json`;
    it already includes whatever parallelism it was measured with, so ``tp`` must be 1)."""
    if spec.startswith("roofline:"):
        parts = spec.split(":", 2)
        if len(parts) != 3 or not all(parts[1:]):
            raise ValueError(f"cost {spec!r}: expected roofline:HARDWARE:MODEL")
        return RooflineCost(profile(parts[1]), load_shape(parts[2]), tp)
    path = Path(spec).expanduser()
    if not path.is_file():
        raise ValueError(
            f"cost {spec!r} is neither roofline:HARDWARE:MODEL nor a calibrated JSON file"
        )
    if tp != 1:
        raise ValueError(f"cost file {spec} is calibrated as measured; tp must be 1, got {tp}")
    return LinearCost.from_json(json.loads(path.read_text()))

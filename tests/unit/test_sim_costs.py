"""Step costs: the roofline by hand, the linear fit (exact recovery, >= 0), loading, profiles."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from kvserve.sim.costs import LinearCost, RooflineCost, StepShape, load_cost
from kvserve.sim.hardware import PROFILES, HardwareProfile, profile
from kvserve.sim.modelshape import PRESETS, ModelShape
from kvserve.sim.nnls import nnls

TRUE = LinearCost(2e-3, 5e-5, 3e-9, 2e-4, 1e-7)


def synthetic_shapes(n: int, seed: int = 0) -> list[StepShape]:
    rng = np.random.default_rng(seed)
    shapes = []
    for _ in range(n):
        prefill = tuple(
            (int(rng.integers(1, 2048)), int(rng.integers(0, 4096)))
            for _ in range(rng.integers(0, 3))
        )
        decode = tuple(int(c) for c in rng.integers(0, 8192, size=rng.integers(0, 65)))
        shapes.append(StepShape(prefill, decode) if prefill or decode else StepShape(decode=(7,)))
    return shapes


# -- StepShape -----------------------------------------------------------------------------


def test_step_shape_totals() -> None:
    shape = StepShape(prefill=((100, 0), (10, 50)), decode=(5, 7, 9))
    assert (shape.prefill_tokens, shape.decode_seqs, shape.decode_context) == (110, 3, 21)
    assert (shape.num_tokens, shape.num_seqs) == (113, 5)
    assert shape.prefill_attention == 100 * 50 + 10 * 55
    with pytest.raises(ValueError, match="need new >= 1"):
        StepShape(prefill=((0, 3),))
    with pytest.raises(ValueError, match="decode contexts must be >= 0"):
        StepShape(decode=(-1,))


# -- roofline ------------------------------------------------------------------------------

TOY_HW = HardwareProfile(
    "toy", peak_flops=100, mem_bw=10, mem_bytes=1e9, flops_efficiency=1, bw_efficiency=1,
    step_overhead_s=0.5, dtype_bytes=1,
)  # fmt: skip
TOY = ModelShape("toy", layers=1, hidden=2, heads=1, kv_heads=1, head_dim=2, intermediate=1,
                 vocab=3, tied_embeddings=True)  # fmt: skip


def test_roofline_by_hand() -> None:
    # layer params 4 (q) + 8 (k, v) + 4 (o) + 6 (MLP) + 4 (norms) = 26; matmul params 26 + 2
    # (final norm) + 6 (lm head) = 34; KV per token 2 x 1 x 1 x 2 x 1 = 4 bytes.
    shape = StepShape(prefill=((2, 1),))
    cost = RooflineCost(TOY_HW, TOY)
    assert cost.flops(shape) == 2 * 52 + 12 + 4 * 2 * (2 * 1 + 3)  # 156
    assert cost.bytes_moved(shape) == 34 + 4 * (1 + 2)  # 46
    assert cost.step_s(shape) == pytest.approx(0.5 + 4.6)
    assert RooflineCost(TOY_HW, TOY, tp=2).step_s(shape) == pytest.approx(0.5 + 2.3)
    assert cost.step_s(StepShape()) == 0.0
    with pytest.raises(ValueError, match="tp must be >= 1"):
        RooflineCost(TOY_HW, TOY, tp=0)


def test_decode_is_memory_bound_and_long_prefill_compute_bound() -> None:
    cost = RooflineCost(profile("h100"), PRESETS["llama3-8b"])
    decode = StepShape(decode=(2048,) * 64)
    assert cost.memory_s(decode) > 3 * cost.compute_s(decode)
    prefill = StepShape(prefill=((4096, 0),))
    assert cost.compute_s(prefill) > 3 * cost.memory_s(prefill)
    assert cost.step_s(prefill) == pytest.approx(1e-3 + cost.compute_s(prefill))


# -- linear fit ----------------------------------------------------------------------------


def test_linear_step_by_hand() -> None:
    cost = LinearCost(1.0, 2.0, 3.0, 4.0, 5.0)
    shape = StepShape(prefill=((4, 2),), decode=(10, 20))
    assert cost.step_s(shape) == 1 + 2 * 4 + 3 * 4 * (2 + 2) + 4 * 2 + 5 * 30
    assert cost.step_s(StepShape()) == 0.0
    with pytest.raises(ValueError, match="per_decode_seq_s must be finite and >= 0"):
        LinearCost(1.0, 2.0, 3.0, -4.0, 5.0)


def test_fit_recovers_known_coefficients_exactly() -> None:
    samples = [(s, TRUE.step_s(s)) for s in synthetic_shapes(40)]
    fitted = LinearCost.fit(samples)
    for name, want in TRUE.coefficients().items():
        assert fitted.coefficients()[name] == pytest.approx(want, rel=1e-9), name
    report = fitted.fit_report(samples)
    assert report["samples"] == 40
    assert report["r2"] == pytest.approx(1.0, abs=1e-12)
    assert report["max_rel_error"] < 1e-9


def test_fit_keeps_coefficients_non_negative() -> None:
    shapes = synthetic_shapes(40, seed=1)
    signs = (1e-3, 5e-5, 3e-9, -2e-4, 1e-7)  # a negative per-decode cost cannot be fitted
    samples = []
    for shape in shapes:
        x = (1, shape.prefill_tokens, shape.prefill_attention, shape.decode_seqs,
             shape.decode_context)  # fmt: skip
        samples.append((shape, max(1e-6, sum(c * v for c, v in zip(signs, x, strict=True)))))
    fitted = LinearCost.fit(samples)
    assert all(c >= 0 for c in fitted.coefficients().values())
    assert fitted.per_decode_seq_s == 0.0


def test_fit_rejects_samples_that_cannot_determine_it() -> None:
    prefill_only = [(StepShape(prefill=((n, c),)), 1.0 + n) for n in (1, 5, 9) for c in (0, 7)]
    with pytest.raises(ValueError, match="never exercise per_decode_seq_s, per_decode_context_s"):
        LinearCost.fit(prefill_only)
    # every decode at the same context: decode context is proportional to the decode count
    same_context = [
        (StepShape(prefill=((n, c),), decode=(64,) * b), 1.0 + n + b)
        for n, c, b in itertools.product((1, 5, 9), (0, 7), (1, 2))
    ]
    with pytest.raises(ValueError, match="determine only 4 of the 5 coefficients"):
        LinearCost.fit(same_context)
    with pytest.raises(ValueError, match="at least 5 samples"):
        LinearCost.fit(same_context[:3])
    with pytest.raises(ValueError, match="finite and > 0"):
        LinearCost.fit([(s, 0.0) for s, _ in same_context])


def best_feasible_residual(a: np.ndarray, b: np.ndarray) -> float:
    """The least residual over every subset of columns whose least-squares solution is >= 0
    (the NNLS optimum is one of them)."""
    best = float(np.sum(b**2))
    for k in range(1, a.shape[1] + 1):
        for cols in itertools.combinations(range(a.shape[1]), k):
            sol = np.linalg.lstsq(a[:, list(cols)], b, rcond=None)[0]
            if (sol >= 0).all():
                best = min(best, float(np.sum((a[:, list(cols)] @ sol - b) ** 2)))
    return best


def test_nnls_matches_brute_force_over_active_sets() -> None:
    rng = np.random.default_rng(3)
    for _ in range(20):
        a, b = rng.normal(size=(12, 5)), rng.normal(size=12)
        x = nnls(a, b)
        assert (x >= 0).all()
        residual = float(np.sum((a @ x - b) ** 2))
        assert residual == pytest.approx(best_feasible_residual(a, b), rel=1e-9, abs=1e-12)


# -- JSON and load_cost --------------------------------------------------------------------


def test_json_round_trip_and_load_cost(tmp_path: Path) -> None:
    data = TRUE.to_json()
    assert data == {"kind": "linear", "coefficients": TRUE.coefficients()}
    path = tmp_path / "cost.json"
    path.write_text(json.dumps({**data, "fit": {"r2": 1.0}}))
    assert load_cost(str(path)) == TRUE
    with pytest.raises(ValueError, match="tp must be 1"):
        load_cost(str(path), tp=2)
    with pytest.raises(ValueError, match="kind is 'roofline', expected 'linear'"):
        LinearCost.from_json({"kind": "roofline"})
    with pytest.raises(ValueError, match="coefficients must be exactly"):
        LinearCost.from_json({"kind": "linear", "coefficients": {"fixed_s": 1.0}})


def test_load_cost_roofline_specs() -> None:
    cost = load_cost("roofline:h200:llama3-70b", tp=4)
    assert cost == RooflineCost(PROFILES["h200"], PRESETS["llama3-70b"], 4)
    with pytest.raises(ValueError, match="expected roofline:HARDWARE:MODEL"):
        load_cost("roofline:h100")
    with pytest.raises(ValueError, match="unknown hardware profile 'tpu'"):
        load_cost("roofline:tpu:llama3-8b")
    with pytest.raises(ValueError, match="neither roofline:HARDWARE:MODEL nor a calibrated"):
        load_cost("/nonexistent/cost.json")


# -- hardware profiles ---------------------------------------------------------------------


def test_hardware_profiles() -> None:
    assert set(PROFILES) == {"a100", "h100", "h200", "cpu"}
    h100 = profile("H100")
    assert h100.flops == pytest.approx(989e12 * h100.flops_efficiency)
    assert h100.bandwidth == pytest.approx(3.35e12 * h100.bw_efficiency)
    assert (profile("h200").mem_bw, profile("a100").peak_flops) == (4.8e12, 312e12)
    assert profile("cpu").dtype_bytes == 4
    with pytest.raises(ValueError, match="known: a100, cpu, h100, h200"):
        profile("tpu")
    with pytest.raises(ValueError, match=r"flops_efficiency is a share .* \(0, 1\]"):
        HardwareProfile("x", peak_flops=1, mem_bw=1, mem_bytes=1, flops_efficiency=1.5)
    with pytest.raises(ValueError, match="mem_bw must be > 0"):
        HardwareProfile("x", peak_flops=1, mem_bw=0, mem_bytes=1)

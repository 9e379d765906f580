"""Accelerator profiles for the roofline step cost (:class:`kvserve.sim.costs.RooflineCost`).

A profile is the few numbers a roofline needs: peak dense FLOP/s and memory bandwidth at the
serving dtype, the share of each a real engine reaches (``flops_efficiency``,
``bw_efficiency``), and a fixed per-step overhead (kernel launches, scheduling, sampling).

Efficiency defaults: large prefill GEMMs in serving engines reach roughly 50-60% of the
dense peak (``0.55``), and the weight/KV streaming of decode roughly 80% of the HBM
bandwidth (``0.8``). The overhead of ``1 ms`` is the order of a CUDA-graph decode step's
launch and scheduling cost in vLLM/SGLang-style engines. All of these are estimates; a
:class:`kvserve.sim.costs.LinearCost` calibrated on real steps replaces them where it exists.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GIB = 2**30


@dataclass(frozen=True)
class HardwareProfile:
    """One accelerator (one device; tensor parallelism is the cost model's ``tp``).

    ``peak_flops`` is dense FLOP/s at the serving dtype, ``mem_bw`` bytes/s, ``mem_bytes``
    the device memory, ``flops_efficiency`` and ``bw_efficiency`` in (0, 1] the reachable
    shares of those peaks, ``step_overhead_s`` the fixed cost of one engine step and
    ``dtype_bytes`` the bytes of one weight or KV element.
    """

    name: str
    peak_flops: float
    mem_bw: float
    mem_bytes: float
    flops_efficiency: float = 0.55
    bw_efficiency: float = 0.8
    step_overhead_s: float = 1e-3
    dtype_bytes: int = 2

    def __post_init__(self) -> None:
        for field in ("peak_flops", "mem_bw", "mem_bytes"):
            value = getattr(self, field)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"hardware {self.name!r}: {field} must be > 0, got {value}")
        for field in ("flops_efficiency", "bw_efficiency"):
            value = getattr(self, field)
            if not 0 < value <= 1:
                raise ValueError(
                    f"hardware {self.name!r}: {field} is a share of the peak, in (0, 1]; "
                    f"got {value}"
                )
        if not (math.isfinite(self.step_overhead_s) and self.step_overhead_s >= 0):
            raise ValueError(
                f"hardware {self.name!r}: step_overhead_s must be >= 0, got {self.step_overhead_s}"
            )
        if self.dtype_bytes < 1:
            raise ValueError(
                f"hardware {self.name!r}: dtype_bytes must be >= 1, got {self.dtype_bytes}"
            )

    @property
    def flops(self) -> float:
        """Reachable FLOP/s (peak x efficiency)."""
        return self.peak_flops * self.flops_efficiency

    @property
    def bandwidth(self) -> float:
        """Reachable memory bytes/s (peak x efficiency)."""
        return self.mem_bw * self.bw_efficiency


PROFILES: dict[str, HardwareProfile] = {
    # NVIDIA A100 SXM4 80GB datasheet: BF16 tensor core 312 TFLOP/s dense (624 sparse),
    # HBM2e 2,039 GB/s, 80 GB.
    "a100": HardwareProfile("a100", peak_flops=312e12, mem_bw=2.039e12, mem_bytes=80 * GIB),
    # NVIDIA H100 SXM5 datasheet: BF16 tensor core 1,979 TFLOP/s with sparsity, i.e. 989
    # dense; HBM3 3.35 TB/s, 80 GB.
    "h100": HardwareProfile("h100", peak_flops=989e12, mem_bw=3.35e12, mem_bytes=80 * GIB),
    # NVIDIA H200 SXM datasheet: same compute as the H100 (989 TFLOP/s dense BF16), HBM3e
    # 4.8 TB/s, 141 GB.
    "h200": HardwareProfile("h200", peak_flops=989e12, mem_bw=4.8e12, mem_bytes=141e9),
    # ROUGH one-core x86 fp32 profile (our CI machine: an AMD EPYC Zen 3 core, AVX2 with two
    # 256-bit FMA pipes = 32 fp32 FLOP/cycle at ~2.45 GHz ~ 78 GFLOP/s; ~20 GB/s of DRAM
    # bandwidth for one core; 24 GB). PyTorch's per-step Python overhead is ~5 ms there.
    # On a CPU the accurate path is a LinearCost calibrated on our own workers; this profile
    # only gives the order of magnitude.
    "cpu": HardwareProfile(
        "cpu",
        peak_flops=78e9,
        mem_bw=20e9,
        mem_bytes=24e9,
        flops_efficiency=0.6,
        bw_efficiency=0.7,
        step_overhead_s=5e-3,
        dtype_bytes=4,
    ),
}


def profile(name: str) -> HardwareProfile:
    """The profile called ``name`` (case-insensitive); ValueError listing the known names."""
    try:
        return PROFILES[name.lower()]
    except KeyError:
        raise ValueError(
            f"unknown hardware profile {name!r}; known: {', '.join(sorted(PROFILES))}"
        ) from None

"""The KV link between a prefill and a decode instance, and how much of a transfer a prefill
hides by streaming its KV layer by layer.

Without streaming the transfer starts when the compute ends, so all of it is exposed:
``latency + nbytes / bandwidth``. With layer-wise streaming, the KV of stage ``i`` (a
layer, or a layer of one prefill chunk) is sent as soon as that stage is computed, while the
next computes: a two-stage pipeline (compute, send) whose sends go one at a time over the
link. Only the part of the last send that ends after the compute is exposed. The latency is
paid once (sends are pipelined on one connection).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Link:
    """A link of ``bandwidth`` bytes/s and a one-way ``latency_s``."""

    bandwidth: float
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.bandwidth) and self.bandwidth > 0):
            raise ValueError(f"link bandwidth must be > 0 bytes/s, got {self.bandwidth}")
        if not (math.isfinite(self.latency_s) and self.latency_s >= 0):
            raise ValueError(f"link latency_s must be >= 0, got {self.latency_s}")

    def transfer_s(self, nbytes: float) -> float:
        """Seconds to move ``nbytes`` in one go: ``latency + nbytes / bandwidth``."""
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        return self.latency_s + nbytes / self.bandwidth


def exposed_transfer_s(
    compute_s: float, nbytes: float, layers: int, link: Link, streaming: bool
) -> float:
    """Seconds of the KV transfer NOT hidden behind the prefill that produces it.

    ``streaming=False``: ``latency + nbytes / bw``. ``streaming=True``: ``layers`` equal
    stages of ``t_c = compute_s / layers`` compute and ``t_x = nbytes / layers / bw`` send;
    the last send ends at ``t_c + t_x + (layers - 1) x max(t_c, t_x) + latency``, and the
    exposed time is that minus ``compute_s``. Always ``t_x + latency <= exposed <=
    latency + nbytes / bw``.
    """
    if layers < 1:
        raise ValueError(f"layers must be >= 1, got {layers}")
    if compute_s < 0:
        raise ValueError(f"compute_s must be >= 0, got {compute_s}")
    if not streaming:
        return link.transfer_s(nbytes)
    t_c = compute_s / layers
    t_x = link.transfer_s(nbytes / layers) - link.latency_s
    end = t_c + t_x + (layers - 1) * max(t_c, t_x) + link.latency_s
    return max(0.0, end - compute_s)


def pipelined_exposed_s(stages: Sequence[tuple[float, float]], link: Link) -> float:
    """:func:`exposed_transfer_s` (streaming) for unequal stages ``(compute_s, nbytes)`` in
    order, e.g. every layer of every prefill chunk: send ``i`` starts when stage ``i`` is
    computed and send ``i - 1`` is done. Equal stages give the closed form above."""
    if not stages:
        raise ValueError("need at least one stage")
    computed = sent = 0.0
    for compute_s, nbytes in stages:
        if compute_s < 0:
            raise ValueError(f"stage compute_s must be >= 0, got {compute_s}")
        computed += compute_s
        sent = max(sent, computed) + link.transfer_s(nbytes) - link.latency_s
    return max(0.0, sent + link.latency_s - computed)


def hidden_share(compute_s: float, nbytes: float, layers: int, link: Link) -> float:
    """``1 - exposed(streaming) / transfer_s(nbytes)``: the share of the no-streaming
    transfer that layer-wise streaming hides (1.0 for an instantaneous transfer)."""
    whole = link.transfer_s(nbytes)
    if whole == 0:
        return 1.0
    return 1.0 - exposed_transfer_s(compute_s, nbytes, layers, link, streaming=True) / whole

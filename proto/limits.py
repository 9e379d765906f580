"""Limits on request fields, shared by both entrances: the router's HTTP edge and the
workers' gRPC edge check the same values, so nothing the router refuses is accepted by a
worker called directly."""

from __future__ import annotations

MIN_TEMPERATURE = 1e-5
"""The smallest non-zero sampling temperature (0 is greedy). Below it, logits divided by
the temperature overflow fp32 and the probabilities become NaN (as vLLM, which treats
such values as greedy; here they are refused)."""

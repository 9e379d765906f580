"""Hypothesis settings shared by the state-machine tests (small enough for 2 cores)."""

from hypothesis import HealthCheck, settings

STATEFUL = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

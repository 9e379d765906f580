"""The ``kvserve bench <what>`` verbs, a table (:data:`BENCH`): each one's settings and the
function that runs it (its module is imported only when it runs, or, for its arguments,
when ``bench`` is the verb being parsed: :func:`kvserve.cli.build_parser`)."""

from __future__ import annotations

import argparse

from kvserve.verbs import Verb, add_verbs

BENCH = (
    Verb("engine", "engine throughput against transformers", "kvserve.bench.engine"),
    Verb("profile", "where a decode step's time goes", "kvserve.bench.profile"),
    Verb(
        "overlap",
        "share of KV transfer hidden by layer-wise streaming (vs transfer after prefill)",
        "kvserve.bench.overlap",
    ),
    Verb(
        "prefix",
        "TTFT of a prompt whose prefix is in the pool, on another prefill worker, vs cold",
        "kvserve.bench.prefix",
    ),
    Verb(
        "serve",
        "serving load (any OpenAI-compatible server): latency, SLO attainment, goodput",
        "kvserve.loadgen.options",
        "kvserve.bench.serve",
    ),
    Verb(
        "compare",
        "one workload on deployments it starts itself (1p1d vs 2m): goodput ratio",
        "kvserve.bench.compare",
    ),
    Verb(
        "peer",
        "kvserve side by side with vLLM's CPU build (installed on first use), same cores",
        "kvserve.bench.peer",
    ),
    Verb(
        "ttft",
        "where an idle cluster's first token goes: client TTFT against the worker calls",
        "kvserve.bench.ttft",
    ),
    Verb(
        "trace",
        "prefix hit rate of a Mooncake trace: real pool vs LRU, local caches vs shared",
        "kvserve.bench.trace.run",
    ),
    Verb(
        "shift",
        "the P:D ratio controller live: a load that turns from prefill- to decode-heavy",
        "kvserve.bench.shift",
    ),
    Verb(
        "pressure",
        "hand-offs through a pool too small for the load: first-to-second-token gap, "
        "landing stall detection against the old fixed wait",
        "kvserve.bench.pressure",
    ),
    Verb(
        "hashing",
        "cost of the keyed prefix chain and the block digests per 1,000 tokens vs prefill",
        "kvserve.bench.hashing",
    ),
    Verb("pool", "KV pool put/get GB/s against memcpy", "kvserve.bench.pool"),
    Verb(
        "index",
        "the router's prefix index: one pass for every worker vs a walk per worker",
        "kvserve.bench.index_timing",
    ),
    Verb(
        "edge",
        "what the HTTP edge's Host and Content-Type checks add per request",
        "kvserve.bench.edge",
    ),
)
"""Every ``kvserve bench`` verb, in the order ``--help`` lists them."""


def add_arguments(bench: argparse.ArgumentParser) -> None:
    """Add one sub-verb per :data:`BENCH` entry to the ``bench`` parser."""
    add_verbs(bench, BENCH, "what")

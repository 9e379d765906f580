"""The router's Prometheus counters as a benchmark reads them around a run: KV bytes and
seconds by direction, prompt tokens by source (``local``, ``pool``, ``computed``: vLLM's
``vllm:prompt_tokens_by_source_total``, its source names translated back by
:data:`proto.metric_names.PROMPT_SOURCES`, so a vLLM server gives them too); servers
without them give None."""

from __future__ import annotations

from typing import Any

import aiohttp

from proto.metric_names import OURS, PROMPT_SOURCES, VLLM

COUNTERS = {
    f"{OURS}kv_transfer_bytes_total": ("kv_bytes", "direction"),
    f"{OURS}kv_transfer_seconds_total": ("kv_seconds", "direction"),
    f"{VLLM}prompt_tokens_by_source_total": ("prompt_tokens", "source"),
}
OUR_SOURCES = {theirs: ours for ours, theirs in PROMPT_SOURCES.items()}


def parse_counters(text: str) -> dict[str, dict[str, float]] | None:
    """The :data:`COUNTERS` in a Prometheus exposition, summed per label value (empty when
    the server has none of them, or has not counted anything yet)."""
    from prometheus_client.parser import text_string_to_metric_families

    found: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in COUNTERS:
                key, label = COUNTERS[sample.name]
                values = found.setdefault(key, {})
                value = sample.labels.get(label, "")
                value = OUR_SOURCES.get(value, value) if key == "prompt_tokens" else value
                values[value] = values.get(value, 0.0) + float(sample.value)
    return found


async def scrape_counters(base_url: str, timeout_s: float = 10.0) -> dict[str, Any] | None:
    """The server's KV/prompt-token counters now, or None if it has no such metrics."""
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(
                base_url.rstrip("/") + "/metrics", timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as resp,
        ):
            if resp.status != 200:
                return None
            return parse_counters(await resp.text())
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None


def counters_delta(
    before: dict[str, dict[str, float]] | None, after: dict[str, dict[str, float]] | None
) -> dict[str, dict[str, float]] | None:
    """``after - before`` per counter and label value; None when the server could not be read
    or never had these counters (not ours). A counter absent before (no sample yet) counts
    from 0."""
    if before is None or not after:
        return None
    return {
        key: {label: value - before.get(key, {}).get(label, 0.0) for label, value in vals.items()}
        for key, vals in after.items()
    }

"""Faults injected while a greedy completion streams: the client side of the fault tests
(:mod:`tests.integration.test_faults`, :mod:`tests.e2e.test_disaggregated`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import openai

from kvserve.cluster import faults
from kvserve.cluster.launch import Cluster
from tests.tiny_cluster import MODEL_NAME

LONG = 300  # output tokens: long enough that a fault lands mid-stream on the tiny model


def complete(client: openai.OpenAI, prompt: list[int], n: int) -> str:
    out = client.completions.create(
        model=MODEL_NAME,
        prompt=prompt,
        max_tokens=n,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    return out.choices[0].text


def stream_with_fault(
    client: openai.OpenAI, prompt: list[int], n: int, after: int, fault: threading.Event
) -> str:
    """Stream a greedy completion; set ``fault`` once ``after`` chunks have come (and read
    on: the server does not wait for the fault, so whoever injects it must be quick)."""
    chunks = client.completions.create(
        model=MODEL_NAME,
        prompt=prompt,
        max_tokens=n,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    parts: list[str] = []
    for i, chunk in enumerate(chunks):
        parts.append(chunk.choices[0].text if chunk.choices else "")
        if i == after:
            fault.set()
    return "".join(parts)


def inject_when(ready: threading.Event, action: object) -> threading.Thread:
    def run() -> None:
        assert ready.wait(60)
        action()  # type: ignore[operator]

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def fault_mid_stream(
    client: openai.OpenAI, cluster: Cluster, prompt: list[int], fault: Callable[[str], None]
) -> tuple[str, str]:
    """Stream ``prompt``; after a few chunks apply ``fault`` to the decode worker serving
    it; returns the text the client got and that worker's name. The worker is looked for
    from the stream's start, so that the fault follows the fifth chunk at once, however
    slowly a loaded machine answers the lookup (the server decodes on meanwhile), over
    channels opened before the stream (:class:`kvserve.cluster.faults.ServingProbe`): a
    lookup that had to connect first could miss a whole stream on a loaded machine. A fault
    that would come only after the stream ended is not applied: the test fails, saying
    what the probe saw."""
    hit: list[str] = []
    ready, done = threading.Event(), threading.Event()

    def find_then_fault(probe: faults.ServingProbe) -> None:
        deadline, name = time.monotonic() + 60, None
        while time.monotonic() < deadline and not done.is_set():
            name = name or probe.serving()
            if name is not None and ready.is_set() and not done.is_set():
                fault(name)
                hit.append(name)
                return
            time.sleep(0.01)

    with faults.ServingProbe(cluster, "decode") as probe:
        thread = threading.Thread(target=find_then_fault, args=(probe,), daemon=True)
        thread.start()
        try:
            text = stream_with_fault(client, prompt, LONG, after=5, fault=ready)
        finally:
            done.set()
            thread.join(60)
    assert hit, f"no fault was injected before the stream ended; the probe saw {probe.seen}"
    return text, hit[0]

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
FAULT_STREAM = 600
"""Output tokens of the stream :func:`fault_mid_stream` faults: its probe must find the
decode worker while it decodes, on a loaded machine (with 300, it once found it only after
the stream had ended)."""


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
    client: openai.OpenAI, prompt: list[int], n: int, after: int, fault: threading.Event | None
) -> str:
    """Stream a greedy completion; set ``fault`` (if any) once ``after`` chunks have come
    (and read on: the server does not wait for the fault, so whoever injects it must be
    quick)."""
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
        if i == after and fault is not None:
            fault.set()
    return "".join(parts)


def stream_text(client: openai.OpenAI, prompt: list[int], n: int) -> str:
    """A greedy completion of ``n`` tokens, streamed: the text of its chunks."""
    return stream_with_fault(client, prompt, n, after=-1, fault=None)


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
    """Stream ``prompt`` and apply ``fault`` to the decode worker serving it as soon as that
    worker has taken it (its decoding starts: the first token is the prefill's); returns the
    text the client got and that worker's name. The worker is looked for from before the
    stream starts, every 10 ms, over channels opened before it
    (:class:`kvserve.cluster.faults.ServingProbe`), and the fault waits for nothing the
    client sees: waiting for the client's first chunks on a loaded machine let the server
    finish a whole stream first (the fault then hit an idle worker and nothing migrated). A
    fault that would come only after the stream ended is not applied: the test fails, saying
    what the probe saw."""
    hit: list[str] = []
    done = threading.Event()

    def find_then_fault(probe: faults.ServingProbe) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not done.is_set():
            name = probe.serving()
            if name is not None and not done.is_set():
                fault(name)
                hit.append(name)
                return
            time.sleep(0.01)

    with faults.ServingProbe(cluster, "decode") as probe:
        thread = threading.Thread(target=find_then_fault, args=(probe,), daemon=True)
        thread.start()
        try:
            text = stream_text(client, prompt, FAULT_STREAM)
        finally:
            done.set()
            thread.join(60)
    assert hit, f"no fault was injected before the stream ended; the probe saw {probe.seen}"
    return text, hit[0]

"""One request handed from a prefill engine to a decode engine in this process, through the
pool or by a direct push, timed phase by phase (what the router and two workers do, without
gRPC).

1. the decode engine reserves pages (and, when streaming, starts pulling layers as they
   land; with ``push``, it offers the pages for a direct push instead);
2. the prefill engine computes the prompt (``handoff=True``): its KV goes to the pool layer
   by layer while it computes (or after, with streaming off) and it samples the first token;
   with a push target, each layer goes into the decode engine's pages as it is computed,
   and the pool is written in the background;
3. the decode engine adopts the request with that token (waiting for the landing to end,
   or pulling everything now; after a push that succeeded, checking its pages against the
   pushed metas), then decodes to the end.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from kvpool.push import PushOutcome
from kvpool.stream import Transfer
from workers.core.outputs import RequestOutput
from workers.core.sequence import SamplingParams
from workers.engine.engine import Engine

PUSH_ANSWER_S = 60.0
"""How long a hand-off waits for the prefill's push to be answered (after its first token)."""


@dataclass
class Handoff:
    """One request's hand-off: its output and the timings of its phases."""

    output_token_ids: list[int] = field(default_factory=list)
    text: str = ""
    prefill_seconds: float = 0.0
    """From the prefill's start to its first token (compute plus the writes' exposed tail)."""
    write: Transfer = field(default_factory=Transfer)
    read: Transfer = field(default_factory=Transfer)
    adopt_seconds: float = 0.0
    """From the first token to the decode engine holding the prompt's KV."""
    push: PushOutcome | None = None
    """How the direct push went (``push`` asked and the decode engine offered a target)."""


def run_until_first(engine: Engine, request_id: str) -> RequestOutput:
    while True:
        for out in engine.step():
            if out.request_id == request_id:
                return out


def handoff(
    prefill: Engine,
    decode: Engine,
    request_id: str,
    prompt: list[int],
    params: SamplingParams,
    lease_s: float = 60.0,
    landing_wait_s: float = 30.0,
    push: bool = False,
) -> Handoff:
    """Run one request across the two engines (``push``: offer and make a direct push, as
    the router does with ``kv_handoff=push``); returns its output and timings."""
    result = Handoff()
    if decode.reserve(request_id, prompt, params.max_tokens, lease_s, offer_push=push) is None:
        raise RuntimeError("the decode engine has no free pages for this prompt")
    target = decode.push_target(request_id)
    t0 = time.perf_counter()
    prefill.add_request(prompt, params, request_id, handoff=True, push=target)
    first = run_until_first(prefill, request_id)
    pushed = result.push = first.push.result(PUSH_ANSWER_S) if first.push is not None else None
    result.prefill_seconds = time.perf_counter() - t0
    result.write = first.transfer or Transfer()
    result.output_token_ids = list(first.new_token_ids)
    result.text = first.text_delta
    if first.finish_reason is not None and first.finish_reason.value != "handoff":
        decode.abort(request_id)
        return result
    t1 = time.perf_counter()
    arrival = decode.arrived(request_id, bool(pushed and pushed.ok))
    if arrival.landing is not None:
        arrival.landing.done.wait(landing_wait_s)
    check, metas = arrival.check, pushed.metas if pushed else []
    verdict = check.run(metas) if check is not None else None
    token = first.new_token_ids[0]
    result.read = decode.adopt(request_id, prompt, token, params, pushed=verdict)
    result.adopt_seconds = time.perf_counter() - t1
    while decode.has_unfinished:
        for out in decode.step():
            if out.request_id == request_id:
                result.output_token_ids.extend(out.new_token_ids)
                result.text += out.text_delta
    return result

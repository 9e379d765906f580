"""A simulated cluster: the router's real placement and ratio policies over :class:`SimEngine`\\ s.

One request's life, as :mod:`router.flow.run` lives it (each message costs ``hop_s``):

1. at arrival the router looks the prompt's block chain up in the pool and asks the
   conductor policy (:mod:`router.placement.policies`, the real one) for a placement, given the load
   reports it last heard (refreshed every ``heartbeat_s``; draining marks are immediate);
2. disaggregated: ``Reserve`` on the first decode candidate with room (none: a 503), then
   the prefill worker prefills with hand-off; its first token goes to the client; the KV
   lands on the decode worker (the part of the transfer the prefill did not hide), which
   adopts the request and decodes it;
3. local: the first decode (or mixed) candidate prefills and decodes by itself;
4. every token reaches the client one hop after the step that made it; the finished
   request becomes a :class:`~kvserve.loadgen.metrics.RequestRecord` and, with a ratio
   controller, a sample of its window.

With a controller (:class:`router.control.ratio.RatioController`, the real one) every
``interval_s`` it decides on the same load view; a move drains the worker (no new work;
it switches once it holds nothing) and is then reported completed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial

from kvserve.loadgen.metrics import RequestRecord
from kvserve.loadgen.workloads import RequestSpec
from kvserve.sim.engine import SimEngine
from kvserve.sim.events import EventLoop
from kvserve.sim.request import RoleEvent, SimRequest, Timing
from router.control.ratio import RatioController, RoleChange
from router.placement.pending import PendingLoad
from router.placement.policies import Placement, PlacementRequest, Policy, WorkerLoad
from workers.core.sequence import FinishReason, SamplingParams
from workers.core.sequence import Sequence as Seq


class SimCluster:
    def __init__(
        self,
        engines: Sequence[SimEngine],
        policy: Policy,
        timing: Timing | None = None,
        controller: RatioController | None = None,
        concurrency: int = 0,
    ) -> None:
        self.engines = {e.worker_id: e for e in engines}
        first = engines[0]
        self.block_tokens = first.config.block_tokens
        self.hasher = first.hasher
        self.pool = first.pool
        self.policy = policy
        self.timing = timing or Timing()
        self.controller = controller
        self.concurrency = concurrency
        self.loop = EventLoop()
        self.role_events: list[RoleEvent] = []
        self.role_timeline: list[tuple[float, dict[str, int]]] = [(0.0, self.role_counts())]
        self._view: dict[str, WorkerLoad] = {}
        self.pending = PendingLoad()
        self._owners: dict[tuple[str, str], Callable[[Seq, FinishReason | None], None]] = {}
        self._open = 0
        self._backlog: deque[RequestSpec] = deque()
        self._done: list[SimRequest] = []
        self._base = 0.0
        self._ticking = False
        self._arrivals = 0
        self._pending: RoleChange | None = None

    # -- running a workload ----------------------------------------------------------------
    def run(self, specs: Sequence[RequestSpec]) -> list[RequestRecord]:
        """Send ``specs`` at their ``arrival_s`` (from now) and run until all have ended;
        their records, times counted from this run's start. Engines keep their caches and
        statistics between runs, as a real cluster does between the rates of a sweep."""
        self._base = self.loop.now
        self._done = []
        self._arrivals += len(specs)
        for spec in specs:
            self.loop.at(self._base + spec.arrival_s, partial(self._arrive, spec))
        self._refresh_view()
        self._tick()
        self.loop.run()
        return sorted((r.record(self._base) for r in self._done), key=lambda r: r.index)

    def _tick(self) -> None:
        """Start the periodic load refresh and controller evaluations (stop when idle)."""
        if self._ticking:
            return
        self._ticking = True
        self.loop.after(self.timing.heartbeat_s, self._heartbeat)
        if self.controller is not None:
            self.loop.after(self.timing.controller_interval_s, self._evaluate)

    def _busy(self) -> bool:
        return bool(self._open or self._backlog or self._arrivals)

    def _heartbeat(self) -> None:
        self._refresh_view()
        if self._busy():
            self.loop.after(self.timing.heartbeat_s, self._heartbeat)
        else:
            self._ticking = False

    def _refresh_view(self) -> None:
        now = self.loop.now
        self._view = {wid: replace(e.load(), report_at=now) for wid, e in self.engines.items()}

    def role_counts(self) -> dict[str, int]:
        counts = {"prefill": 0, "decode": 0, "mixed": 0}
        for e in self.engines.values():
            counts[e.role] += 1
        return counts

    # -- one request -----------------------------------------------------------------------
    def _arrive(self, spec: RequestSpec) -> None:
        self._arrivals -= 1
        self._send(spec)

    def _send(self, spec: RequestSpec) -> None:
        if self.concurrency and self._open >= self.concurrency:
            self._backlog.append(spec)
            return
        self._open += 1
        req = SimRequest(spec, start_s=self.loop.now)
        tokens = list(spec.prompt_token_ids)
        pooled = 0
        if self.pool is not None:
            hashes = self.hasher.chain(tokens, self.block_tokens)
            pooled = self.pool.leading(hashes) * self.block_tokens
        request = PlacementRequest(len(tokens), pooled)
        loads = self.pending.apply(list(self._view.values()))
        placement = self.policy.place(request, loads)
        if placement is not None:
            self.pending.placed(placement, request, loads)
        if placement is None:
            self._fail(req, "no worker can serve the request", 503)
        elif placement.prefill is None:
            self.loop.after(self.timing.hop_s, lambda: self._local(req, placement.decode))
        else:
            self.loop.after(self.timing.hop_s, lambda: self._reserve(req, placement))

    def _seq(self, req: SimRequest, handoff: bool = False) -> Seq:
        params = SamplingParams(max_tokens=req.spec.max_tokens, ignore_eos=True)
        seq = Seq(f"r{req.spec.index}", list(req.spec.prompt_token_ids), params)
        seq.handoff = handoff
        return seq

    def _local(self, req: SimRequest, candidates: tuple[str, ...]) -> None:
        for wid in candidates:
            engine = self.engines[wid]
            if engine.draining:
                continue
            seq = self._seq(req)
            try:
                engine.submit(seq)
            except ValueError as exc:  # can never fit: the worker's INVALID_ARGUMENT
                self._fail(req, str(exc), 400)
                return
            self._own(engine, seq, lambda s, reason: self._decoded(req, s, reason))
            self._kick(engine)
            return
        self._fail(req, "every decode candidate is draining", 503)

    def _reserve(self, req: SimRequest, placement: Placement) -> None:
        for wid in placement.decode:
            decoder = self.engines[wid]
            seq = self._seq(req)
            try:
                if decoder.draining or not decoder.reserve(seq):
                    continue
            except ValueError as exc:  # can never fit: the worker's INVALID_ARGUMENT
                self._fail(req, str(exc), 400)
                return
            prefill = self.engines[str(placement.prefill)]
            self.loop.after(2 * self.timing.hop_s, partial(self._prefill, req, prefill, decoder))
            return
        self.loop.after(self.timing.hop_s, lambda: self._fail(req, "no decode pages", 503))

    def _prefill(self, req: SimRequest, prefill: SimEngine, decoder: SimEngine) -> None:
        seq = self._seq(req, handoff=True)
        self._own(
            prefill, seq, lambda s, reason: self._handed_off(req, s, reason, prefill, decoder)
        )
        prefill.submit(seq)
        self._kick(prefill)

    def _handed_off(
        self,
        req: SimRequest,
        seq: Seq,
        reason: FinishReason | None,
        prefill: SimEngine,
        decoder: SimEngine,
    ) -> None:
        """The prefill worker's step made the first token: to the client, then to decode."""
        hop = self.timing.hop_s
        req.cached_tokens = seq.num_cached_tokens
        req.chunks.append(self.loop.now + hop)
        rid = seq.request_id
        if reason is FinishReason.LENGTH:  # one token asked: the reservation goes back
            decoder.release(rid)
            self._maybe_switch(decoder)
            self.loop.after(hop, lambda: self._finish(req))
            return
        first = seq.output_token_ids[0]
        step_s, step_tokens = prefill.last_step
        landing = decoder.kv.landing_s(step_s, step_tokens, seq.num_prompt_tokens)

        def adopt() -> None:
            adopted = decoder.adopt(rid, first)
            self._own(decoder, adopted, lambda s, why: self._decoded(req, s, why))
            self._kick(decoder)

        self.loop.after(max(2 * hop, landing), adopt)

    def _decoded(self, req: SimRequest, seq: Seq, reason: FinishReason | None) -> None:
        if not req.chunks:
            req.cached_tokens = seq.num_cached_tokens
        req.chunks.append(self.loop.now + self.timing.hop_s)
        if reason is not None:
            self.loop.after(self.timing.hop_s, lambda: self._finish(req))

    def _fail(self, req: SimRequest, error: str, status: int) -> None:
        req.error, req.status = error, status
        self._finish(req)

    def _finish(self, req: SimRequest) -> None:
        req.end_s = self.loop.now
        self._done.append(req)
        self._open -= 1
        if self.controller is not None:
            record = req.record(self._base)
            self.controller.record(self.loop.now, record.ttft_s, record.tpot_s)
        if self._backlog:
            self._send(self._backlog.popleft())

    # -- engines ---------------------------------------------------------------------------
    def _own(
        self, engine: SimEngine, seq: Seq, on_token: Callable[[Seq, FinishReason | None], None]
    ) -> None:
        self._owners[(engine.worker_id, seq.request_id)] = on_token

    def _kick(self, engine: SimEngine) -> None:
        if engine.busy:
            return
        seconds = engine.start_step()
        if seconds is not None:
            self.loop.after(seconds, lambda: self._stepped(engine))

    def _stepped(self, engine: SimEngine) -> None:
        for seq, reason in engine.end_step():
            key = (engine.worker_id, seq.request_id)
            on_token = self._owners[key] if reason is None else self._owners.pop(key)
            on_token(seq, reason)
        self._kick(engine)
        self._maybe_switch(engine)

    # -- the ratio controller --------------------------------------------------------------
    def _evaluate(self) -> None:
        assert self.controller is not None
        change = self.controller.decide(self.loop.now, list(self._view.values()))
        if change is not None:
            engine = self.engines[change.worker_id]
            engine.draining = True
            self._view[engine.worker_id] = replace(self._view[engine.worker_id], draining=True)
            self._pending = change
            self._maybe_switch(engine)
        if self._busy():
            self.loop.after(self.timing.controller_interval_s, self._evaluate)

    def _maybe_switch(self, engine: SimEngine) -> None:
        change = self._pending
        if change is None or change.worker_id != engine.worker_id or not engine.idle:
            return
        assert self.controller is not None
        engine.role, engine.draining = change.to_role, False
        self._pending = None
        now = self.loop.now
        self.controller.completed(change, now)
        self.role_events.append(RoleEvent(change, now))
        self.role_timeline.append((now, self.role_counts()))
        self._refresh_view()

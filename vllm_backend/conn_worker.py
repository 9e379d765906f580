"""The worker side of the kvserve connector (in vLLM's model worker process).

Lifecycle:

1. :meth:`WorkerSide.register` when vLLM allocated its KV caches: finds how they hold a
   block (:func:`vllm_backend.layouts.detect`, with vLLM's own cache-update op), refuses a
   layout whose wire name is not the one the worker's contract promised, and joins the pool
   over host staging slots that hold each span in the wire order
   (:class:`workers.handoff.staging.TorchCopier` over :class:`vllm_backend.layouts.VllmViews`);
2. per step, :meth:`WorkerSide.begin` with the scheduler side's plan; before the forward
   (vLLM calls it there when the step loads), :meth:`WorkerSide.start_loads` reads the
   metas and the partial last blocks, then a helper thread reads the full blocks layer by
   layer (:class:`kvpool.layer_load.LayerLoad`, each span verified before it reaches its
   page); :meth:`WorkerSide.wait_layer` holds layer ``i``'s attention until its layer has
   arrived; :meth:`WorkerSide.save_layer` after layer ``i`` computed puts that layer of
   the step's blocks on the writer thread (:class:`kvpool.stream.StreamWriter`, planned at
   the step's first layer); :meth:`WorkerSide.end_step` waits for both, turns the blocks
   that did not arrive whole into vLLM's load errors (it recomputes them: nothing
   unverified is ever used), drops the step's writes when any block did not arrive (the
   step computed over those pages: its KV is not published) and reports what moved
   (:mod:`vllm_backend.reports`);
3. :meth:`WorkerSide.close` when vLLM shuts the connector down.

Without a pool (it could not be joined) every load is empty and nothing is written: vLLM
serves from its own cache.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from kvpool.layer_load import LayerLoad, LoadRun
from kvpool.pool import KVPool
from kvpool.stream import StepWrite, StreamWriter
from vllm_backend.conn_scheduler import StepPlan
from vllm_backend.layouts import CacheWrite, LayoutError, VllmViews, detect
from vllm_backend.reports import POOL_EVERY_S, Reporter, pool_report
from vllm_backend.spec import ConnectorSpec
from workers.handoff.pool_transfer import pool_index, pool_over
from workers.handoff.staging import TorchCopier, slots_for

log = logging.getLogger(__name__)
SWEEP_EVERY_S = 5.0
"""How often expired partial blocks this worker wrote are removed."""


class WorkerSide:
    """See the module docstring."""

    def __init__(self, spec: ConnectorSpec) -> None:
        self.spec = spec
        self.reporter = Reporter(spec.reports)
        self.pool: KVPool | None = None
        self.writer: StreamWriter | None = None
        self.layers: dict[str, int] = {}
        self._loader = ThreadPoolExecutor(1, thread_name_prefix="kv-load")
        self._plan = StepPlan()
        self._load: LayerLoad | None = None
        self._loading: Future[None] | None = None
        self._arrived: list[threading.Event] = []
        self._step: StepWrite | None = None
        self._errors: set[int] = set()
        self._failed = False
        """The step's loads failed before they started (every page is an error)."""
        self._next_sweep = 0.0
        self._closing = threading.Event()
        self._pool_lock = threading.Lock()

    def register(
        self, caches: dict[str, torch.Tensor], index_of: Callable[[str], int], write: CacheWrite
    ) -> None:
        """Step 1: ``caches`` by layer name, ``index_of(name)`` its layer number, ``write``
        vLLM's cache-update op (for :func:`~vllm_backend.layouts.detect`). LayoutError
        when the cache cannot be the contract's wire layout."""
        names = sorted(caches, key=index_of)
        self.layers = {name: i for i, name in enumerate(names)}
        kind = detect(caches[names[0]], write)
        views = VllmViews(kind, [caches[name] for name in names])
        layout = views.wire_layout()
        if layout.wire != self.spec.wire:
            raise LayoutError(
                f"vLLM's KV cache is {layout.wire} on the wire, the worker's contract says "
                f"{self.spec.wire}: check the model, --dtype and --block-tokens"
            )
        copier = TorchCopier(views, slots_for(self.spec.pool.kv_staging_mib, layout.span_bytes))
        index = pool_index(self.spec.cluster) if self.spec.pool.pool_eviction == "chain" else None
        keys = self.spec.cluster.keyring
        self.pool = pool_over(
            self.spec.pool, self.spec.namespace, layout, copier, self.spec.writer,
            keys.pool_block, index,
        )  # fmt: skip
        self.reporter.send("joined", ok=self.pool is not None)
        if self.pool is not None:
            self.writer = StreamWriter(self.pool)
            threading.Thread(target=self._report_pool, name="kv-pool-report", daemon=True).start()
        log.info("kvserve connector: vLLM's %s cache joined the pool as %s", kind, layout.wire)

    def begin(self, plan: StepPlan) -> None:
        """Step 2: the step's plan (vLLM binds it before the forward)."""
        self._plan, self._step, self._failed = plan, None, False

    def start_loads(self) -> None:
        """Read the metas and the partial blocks now, the full blocks layer by layer on the
        loader thread. Without a pool here (the scheduler side may have one), or when the
        first reads fail, every planned page is a load error: vLLM recomputes it."""
        if not self._plan.loads or self._load is not None or self._failed:
            return
        try:
            if self.pool is None:
                raise RuntimeError("no pool on the worker side")
            load = self._first_reads(self.pool)
        except Exception as exc:
            log.warning("kvserve connector: a pool load failed: %s", exc)
            self._failed = True
            for item in self._plan.loads:
                self._errors.update(item.pages)
                self.reporter.send("load", rid=item.rid, tokens=0, bytes=0, seconds=0.0,
                                   exposed=0.0)  # fmt: skip
            return
        self._load = load
        self._arrived = [threading.Event() for _ in range(load.pool.layout.num_layers)]
        self._loading = self._loader.submit(self._read_layers, load)

    def _first_reads(self, pool: KVPool) -> LayerLoad:
        runs = [
            LoadRun(
                [pool.keys.meta_key(n) for n in item.names]
                + ([pool.keys.request_key(item.rid)] if item.partial else []),
                item.pages,
                item.names,
                item.prefix,
                item.partial,
            )
            for item in self._plan.loads
        ]
        load = LayerLoad(pool, runs)
        load.read_metas()
        for layer in range(pool.layout.num_layers):
            load.read_layer(layer, tails=True)
        return load

    def _read_layers(self, load: LayerLoad) -> None:
        try:
            for layer, arrived in enumerate(self._arrived):
                load.read_layer(layer)
                arrived.set()
        finally:
            for arrived in self._arrived:  # a failure must not hold the forward forever
                arrived.set()

    def wait_layer(self, name: str) -> None:
        if self._load is not None and (layer := self.layers.get(name)) is not None:
            self._arrived[layer].wait()

    def save_layer(self, name: str) -> None:
        if self.writer is None or not self._plan.writes:
            return
        if self._step is None:
            self._step = self.writer.plan_writes(self._plan.writes)
        if (layer := self.layers.get(name)) is not None:
            self._step.on_layer(layer)

    def end_step(self) -> None:
        """Wait for the step's loads and writes; report them (module docstring)."""
        t0 = time.perf_counter()
        whole = not self._failed and (self._load is None or self._finish_loads(self._load, t0))
        if self._step is not None and not whole:
            self._step.abandon()  # computed over pages that never arrived: never published
            self._step = None
        if self._step is not None:
            transfer = self._step.finish(self._plan.wait_commit)
            total = sum(self._step.owners.values()) or 1
            for rid, count in self._step.owners.items():
                self.reporter.send(
                    "write", rid=rid, bytes=transfer.bytes * count // total,
                    seconds=transfer.seconds, exposed=transfer.exposed_seconds,
                )  # fmt: skip
            self._step = None
        self._housekeeping()

    def _finish_loads(self, load: LayerLoad, t0: float) -> bool:
        """Whether every planned page arrived. What did not is a load error; after a
        failed read nothing of the load is trusted (a layer may have been cut mid-way)."""
        assert self._loading is not None and self.pool is not None
        try:
            self._loading.result()
            good = load.finish()
        except Exception as exc:  # what did not arrive is recomputed
            log.warning("kvserve connector: a pool load failed: %s", exc)
            good = [0] * len(self._plan.loads)
        exposed = time.perf_counter() - t0
        layout = self.pool.layout
        whole = True
        for item, arrived in zip(self._plan.loads, good, strict=True):
            whole = whole and arrived == len(item.pages)
            self._errors.update(item.pages[arrived:])
            if item.partial:
                self.pool.partials.drop(item.rid)
            self.reporter.send(
                "load", rid=item.rid, tokens=item.tokens(arrived, layout.block_tokens),
                bytes=arrived * layout.num_layers * layout.span_bytes, seconds=load.seconds,
                exposed=exposed,
            )  # fmt: skip
        self._send_pool(probe=False)  # its counters reach the worker before the output
        self._load = self._loading = None
        return whole

    def load_errors(self) -> set[int]:
        """vLLM block ids whose load failed since the last call (vLLM recomputes them)."""
        errors, self._errors = self._errors, set()
        return errors

    def _housekeeping(self) -> None:
        now = time.monotonic()
        if self.pool is not None and now >= self._next_sweep:
            self._next_sweep = now + SWEEP_EVERY_S
            self.pool.partials.sweep()

    def _report_pool(self) -> None:
        """Every :data:`POOL_EVERY_S`, the pool's counters and health to the worker (also
        while vLLM runs no step: a pool outage shows while idle too)."""
        while not self._closing.wait(POOL_EVERY_S):
            try:
                self._send_pool()
            except Exception as exc:  # a report is never worth the connector
                log.warning("kvserve connector: no pool report: %s", exc)

    def _send_pool(self, probe: bool = True) -> None:
        """One ``pool`` report, taken and sent under a lock: reports arrive in the order
        their counters were read (a late one never overwrites a newer one). ``probe=False``
        in a step: the breaker's state only, never a wait on the master."""
        with self._pool_lock:
            if self.pool is not None:
                self.reporter.send("pool", **pool_report(self.pool, probe))

    def close(self) -> None:
        """Stop the reports, the loader and the writer, then leave the pool (under the
        report lock: no report reads a pool being closed)."""
        self._closing.set()
        self._loader.shutdown(wait=True)
        if self.writer is not None:
            self.writer.close()
        with self._pool_lock:
            if self.pool is not None:
                self.pool.close()
                self.pool.store.close()
            self.pool = None
        self.reporter.close()

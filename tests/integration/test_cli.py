"""The ``kvserve`` command as a user runs it (real subprocesses)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from proto.credentials import GRANT_PREFIX
from proto.grants import grant
from workers.model.prepare import make_tiny_model

KVSERVE = [sys.executable, "-m", "kvserve"]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*KVSERVE, *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
    )


def test_generate_with_default_model_gives_real_text(default_model_dir: Path) -> None:
    proc = run("generate", "What is the capital of France?", "--max-tokens", "20")
    assert proc.returncode == 0, proc.stderr
    assert "Paris" in proc.stdout


def test_generate_settings_from_environment(tiny_model_dir: Path) -> None:
    proc = run(
        "generate",
        "--no-chat",
        "hello",
        "--max-tokens",
        "3",
        env={"KVSERVE_MODEL": str(tiny_model_dir), "KVSERVE_BLOCK_TOKENS": "8"},
    )
    assert proc.returncode == 0, proc.stderr
    assert "3 tokens" in proc.stderr


def test_missing_model_is_a_clear_error(tmp_path: Path) -> None:
    proc = run("generate", "hi", "--model", str(tmp_path / "nope"))
    assert proc.returncode == 2
    assert "no model at" in proc.stderr and "Traceback" not in proc.stderr


def test_make_model_is_deterministic(tmp_path: Path, default_model_dir: Path) -> None:
    a = make_tiny_model(tmp_path / "a", seed=3, tokenizer_dir=default_model_dir)
    proc = run(
        "make-model",
        "--out",
        str(tmp_path / "b"),
        "--seed",
        "3",
        "--tokenizer-from",
        str(default_model_dir),
    )
    assert proc.returncode == 0, proc.stderr
    digest = [
        hashlib.sha256((d / "model.safetensors").read_bytes()).hexdigest()
        for d in (a, tmp_path / "b")
    ]
    assert digest[0] == digest[1]
    other = make_tiny_model(tmp_path / "c", seed=4, tokenizer_dir=default_model_dir)
    assert (other / "model.safetensors").read_bytes() != (a / "model.safetensors").read_bytes()


def _children(pid: int) -> dict[int, tuple[str, dict[str, str]]]:
    """``pid``'s child processes: command line and environment of each (Linux /proc)."""
    found = {}
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and (proc / "stat").read_text().rsplit(")", 1)[1].split()[
                1
            ] == str(pid):
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                pairs = (proc / "environ").read_bytes().split(b"\0")
                env = dict(p.decode().split("=", 1) for p in pairs if b"=" in p)
                found[int(proc.name)] = (cmdline, env)
        except (OSError, IndexError):
            continue  # exited meanwhile
    return found


def test_up_with_api_keys_asks_with_one_and_hands_secrets_out_by_need(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """``kvserve up --ask`` with ``KVSERVE_API_KEY`` set answers (it presents a key the
    router accepts); the router alone has the keys, every worker and the router have their
    role's own Redis user (its password derived from the made-up one) and a grant of their
    role cut from the made-up cluster secret in their environment (never the secret), and no
    command line holds a secret."""
    argv = [*KVSERVE, "up", "--free-ports", "--prefill", "0", "--decode", "0", "--mixed", "1"]
    argv += ["--no-use-pool", "--no-pin-cores", "--model", str(tiny_model_dir)]
    argv += ["--kv-cache-mib", "16", "--block-tokens", "16", "--log-dir", str(tmp_path)]
    argv += ["--startup-timeout-s", "300", "--ask", "Hello"]
    env = {**os.environ, "KVSERVE_API_KEY": "alice=k-test-1,k-test-2"}
    env.pop("KVSERVE_CLUSTER_SECRET", None)
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env) as up:
        try:
            assert up.stdout is not None and up.stdout.readline(), up.communicate(timeout=30)
            children = _children(up.pid).values()
            roles = {
                role: [e for c, e in children if f" {role} " in c] for role in ("worker", "router")
            }
            assert len(roles["worker"]) == 1 and len(roles["router"]) == 1
            (router,), (worker,) = roles["router"], roles["worker"]
            assert router["KVSERVE_API_KEY"] == env["KVSERVE_API_KEY"]
            assert "KVSERVE_API_KEY" not in worker
            grants = [worker["KVSERVE_CLUSTER_SECRET"], router["KVSERVE_CLUSTER_SECRET"]]
            assert all(g.startswith(GRANT_PREFIX) for g in grants) and len(set(grants)) == 2
            passwords = [worker["KVSERVE_REDIS_PASSWORD"], router["KVSERVE_REDIS_PASSWORD"]]
            assert len(set(passwords)) == 2  # each role its own Redis user (redis_acl)
            named = {role: [c for c, _ in children if f" {role} " in c] for role in roles}
            assert all(f"--redis-username {role} " in named[role][0] for role in roles)
            secrets = [*grants, *passwords]
            assert not any(s in c for c, _ in children for s in [*secrets, "k-test-1"])
            assert not any("KVSERVE_API_KEY" in e for c, e in children if "redis-server" in c)
        finally:
            up.terminate()
            _, err = up.communicate(timeout=120)
    assert up.returncode == 0, err.decode()[-3000:]
    assert "Traceback" not in err.decode()


def test_grant_prints_a_roles_grant_from_the_environment_only() -> None:
    """``kvserve grant worker`` cuts a worker's grant from ``KVSERVE_CLUSTER_SECRET``; without
    the variable it fails naming it (the secret is never a flag)."""
    secret = "q" * 64
    done = run("grant", "worker", env={"KVSERVE_CLUSTER_SECRET": secret})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == grant(secret, "worker")
    refused = run("grant", "router", env={"KVSERVE_CLUSTER_SECRET": ""})
    assert refused.returncode == 2 and "KVSERVE_CLUSTER_SECRET" in refused.stderr

"""vLLM's own server for ``kvserve bench peer``: ``vllm serve`` in vLLM's environment
(:mod:`kvserve.vllm_env`, installed on first use by :func:`kvserve.vllm_env.ensure_vllm`).

Lifecycle of a server (:func:`vllm_server`): started on a free loopback port in its own
process group (:class:`kvserve.cluster.processes.ManagedProcess`: it also gets SIGTERM if this
process dies), ``/health`` polled until it answers 200 (50-150 s on 2 cores) or the
timeout, then yielded; on exit (also on errors and Ctrl-C) SIGTERM to the group, SIGKILL
after the grace period. The client runs are in :mod:`kvserve.bench.peer_client`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from kvpool.net import free_local_ports
from kvserve.cluster.health import http_ok
from kvserve.cluster.processes import ManagedProcess
from kvserve.report import log
from kvserve.vllm_env import QUIET_ENV, VllmEnv


def server_env(kvcache_gib: float) -> dict[str, str]:
    """Environment of ``vllm serve``: offline, no telemetry, KV cache size in GiB."""
    return {**QUIET_ENV, "VLLM_CPU_KVCACHE_SPACE": f"{kvcache_gib:g}"}


def serve_argv(
    env: VllmEnv,
    model_dir: Path,
    name: str,
    port: int,
    max_model_len: int = 2048,
    extra: Sequence[str] = (),
) -> list[str]:
    """``vllm serve`` of ``model_dir`` as ``name`` on 127.0.0.1:``port``, fp32, with
    ``extra`` flags (e.g. ``--enforce-eager``, ``--block-size``)."""
    argv = env.command("serve", str(model_dir), "--host", "127.0.0.1", "--port", str(port))
    argv += ["--max-model-len", str(max_model_len), "--dtype", "float32"]
    return [*argv, "--served-model-name", name, *extra]


def wait_healthy(proc: ManagedProcess, url: str, timeout_s: float) -> float:
    """Poll ``url/health`` until 200; the seconds it took. Raises RuntimeError (with the
    log's tail) if the process exits first or ``timeout_s`` passes."""
    begin = time.monotonic()
    while not http_ok(url + "/health", timeout=2.0):
        if not proc.running:
            raise proc.failure("exited during start-up")
        if time.monotonic() - begin > timeout_s:
            raise proc.failure(f"was not healthy after {timeout_s:.0f}s")
        time.sleep(1.0)
    return time.monotonic() - begin


@contextlib.contextmanager
def vllm_server(
    env: VllmEnv,
    model_dir: Path,
    log_dir: Path,
    *,
    kvcache_gib: float,
    max_model_len: int,
    startup_timeout_s: float,
    stop_grace_s: float = 15.0,
    extra: Sequence[str] = (),
    environment: Mapping[str, str] | None = None,
) -> Iterator[str]:
    """A vLLM server of ``model_dir`` (served as its directory name; ``extra`` flags, more
    ``environment``), healthy; yields its base URL and stops it on exit (see the module
    docstring)."""
    port = free_local_ports(1)[0]
    argv = serve_argv(env, model_dir, model_dir.name, port, max_model_len, extra)
    own = {**server_env(kvcache_gib), **(environment or {})}
    proc = ManagedProcess("vllm", argv, log_dir / "vllm.log", env=own)
    url = f"http://127.0.0.1:{port}"
    try:
        proc.start()
        seconds = wait_healthy(proc, url, startup_timeout_s)
        log(f"bench peer: vllm up in {seconds:.0f}s at {url}")
        yield url
    finally:
        proc.stop(stop_grace_s)

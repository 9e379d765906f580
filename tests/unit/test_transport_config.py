"""Transport settings (pure): credentials and TLS validation, keepalive options, and
loopback defaults of every listening socket."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

import kvserve.cli as cli
from kvpool.config import PoolConfig
from kvpool.master import MasterConfig
from kvserve.cluster.pool import master_command
from kvserve.cluster.redis import RedisConfig, redis_command
from kvserve.cluster.spec import ClusterSpec
from kvserve.settings import config_from_args
from proto import channels
from proto.registry import ClusterConfig, explain
from router.config import RouterConfig
from workers.config import WorkerConfig

PEM = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def test_defaults_are_plaintext_with_a_five_second_peer_timeout() -> None:
    c = ClusterConfig()
    assert (c.redis_username, c.redis_password, c.peer_timeout_s) == ("", "", 5.0)
    assert not c.grpc_tls
    assert channels.channel_credentials(c) is None and channels.server_credentials(c) is None


def test_password_stays_out_of_repr_and_log_addresses() -> None:
    c = ClusterConfig(redis_password="hunter2")
    assert "hunter2" not in repr(c)
    in_url = ClusterConfig(redis_url="redis://:hunter2@10.0.0.5:6380/1")
    assert in_url.redis_where == "redis://10.0.0.5:6380/1"
    assert ClusterConfig().redis_where == ClusterConfig().redis_url


def test_credentials_in_one_place_only() -> None:
    with pytest.raises(ValueError, match="one place"):
        ClusterConfig(redis_url="redis://:a@127.0.0.1:6379/0", redis_password="b")


def test_password_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVSERVE_REDIS_PASSWORD", "from-env")
    monkeypatch.setenv("KVSERVE_PEER_TIMEOUT_S", "2.5")
    for verb in ("worker", "router"):
        ns = cli.build_parser().parse_args([verb])
        cluster = config_from_args(ClusterConfig, ns)
        assert (cluster.redis_password, cluster.peer_timeout_s) == ("from-env", 2.5)


def test_tls_settings_are_checked_with_actionable_errors(tmp_path: Path) -> None:
    pem, junk = tmp_path / "a.pem", tmp_path / "junk.txt"
    pem.write_bytes(PEM)
    junk.write_text("not a certificate")
    with pytest.raises(ValueError, match="go together"):
        ClusterConfig(grpc_tls_cert=str(pem))
    with pytest.raises(ValueError, match="go together"):
        ClusterConfig(grpc_tls_key=str(pem))
    with pytest.raises(ValueError, match=r"grpc_tls_ca: cannot read .*missing"):
        ClusterConfig(grpc_tls_ca=str(tmp_path / "missing.pem"))
    with pytest.raises(ValueError, match=r"grpc_tls_cert: .* not a PEM"):
        ClusterConfig(grpc_tls_cert=str(junk), grpc_tls_key=str(pem))
    with pytest.raises(ValueError, match="peer_timeout_s"):
        ClusterConfig(peer_timeout_s=0)
    ca_only = ClusterConfig(grpc_tls_ca=str(pem))  # a client that only verifies workers
    assert ca_only.grpc_tls
    with pytest.raises(ValueError, match="grpc_tls_cert and grpc_tls_key"):
        channels.server_credentials(ca_only)


def test_keepalive_options_follow_the_peer_timeout() -> None:
    c = ClusterConfig(peer_timeout_s=4.0)
    client, server = dict(channels.channel_options(c)), dict(channels.server_options(c))
    for options in (client, server):
        assert options["grpc.keepalive_time_ms"] == 2000
        assert options["grpc.keepalive_timeout_ms"] == 2000
        assert options["grpc.http2.ping_timeout_ms"] == 2000
        assert options["grpc.keepalive_permit_without_calls"] == 1
        assert options["grpc.http2.max_pings_without_data"] == 0
    assert server["grpc.http2.min_ping_interval_without_data_ms"] <= 2000
    assert server["grpc.http2.max_ping_strikes"] == 0


def test_errors_name_the_setting_to_change() -> None:
    c = ClusterConfig(redis_username="kv", redis_password="secret")
    text = explain(c, redis.AuthenticationError("invalid username-password pair"))
    assert "KVSERVE_REDIS_PASSWORD" in text and "--redis-username" in text
    assert "secret" not in text
    text = explain(c, redis.exceptions.NoPermissionError("no permissions"))
    assert "'kv'" in text and "kvserve:*" in text


def test_every_listening_socket_defaults_to_loopback() -> None:
    assert WorkerConfig().worker_host == "127.0.0.1"
    assert RouterConfig().router_host == "127.0.0.1"
    assert ClusterSpec().host == "127.0.0.1"
    assert PoolConfig().pool_local_hostname == "127.0.0.1"
    master = MasterConfig()
    assert master.master_host == "127.0.0.1"
    argv = master_command(master)
    for flag in ("--rpc_address", "--http_metadata_server_host", "--metrics_host"):
        assert f"{flag}=127.0.0.1" in argv
    argv = redis_command(RedisConfig())
    assert argv[argv.index("--bind") + 1] == "127.0.0.1"
    up = cli.build_parser().parse_args(["up"])
    assert (up.host, up.master_host) == ("127.0.0.1", "127.0.0.1")


def test_the_launcher_forwards_transport_settings(tmp_path: Path) -> None:
    pem = tmp_path / "a.pem"
    pem.write_bytes(PEM)
    ns = cli.build_parser().parse_args(
        ["up", "--peer-timeout-s", "3", "--grpc-tls-ca", str(pem), "--redis-username", "kv"]
    )
    from kvserve.cluster.up import spec_from_args

    ns.redis_password = "pw"
    spec = spec_from_args(ns)
    expected = dataclasses.replace(
        ClusterConfig(redis_url=spec.redis_config.url),
        peer_timeout_s=3.0,
        grpc_tls_ca=str(pem),
        redis_username="kv",
        redis_password="pw",
        cluster_secret=spec.cluster.cluster_secret,
    )
    assert spec.cluster_config == expected
    assert len(spec.cluster.cluster_secret) == 64  # made up, since none was given


FORK_PROBE = """
import sys, threading, subprocess, time
import {first}
import kvserve.cli  # as every process of the project starts
import grpc
channel = grpc.insecure_channel("127.0.0.1:1")
busy = threading.Thread(target=lambda: grpc.channel_ready_future(channel).result(timeout=30))
busy.daemon = True
busy.start()  # another thread inside gRPC while this one forks
time.sleep(0.3)
codes = [subprocess.run(["true"], preexec_fn=lambda: None).returncode for _ in range(5)]
print(codes)
"""
"""Forks to exec while another thread waits inside gRPC, as the launcher does, and prints
the children's exit statuses; gRPC core's fork handlers, when on, say so on stderr
(``fork_posix.cc``: "skipping fork() handlers"), and a child may then die of SIGABRT
before it execs (-6)."""


def test_grpc_fork_handlers_stay_out_of_every_process() -> None:
    """gRPC's fork handlers could deadlock a forking process or abort its child (see
    :mod:`kvserve`): a process that starts as the project's do (``kvserve`` imported first)
    has none, and every child it forks execs. gRPC reads the setting when it is imported: a
    process that imports grpc before ``kvserve`` has them (what every process had when only
    :mod:`proto.channels` set it, after its own ``import grpc``; that case is not run here,
    since a child of it may die and the process may hang in ``fork()``). A fresh
    interpreter, as each process starts."""
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    code = FORK_PROBE.format(first="kvserve")
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "skipping fork() handlers" not in done.stderr, done.stderr
    assert done.stdout.strip() == "[0, 0, 0, 0, 0]", done.stderr  # every child exec'd


@pytest.mark.parametrize(("given", "seen"), [(None, "false"), ("true", "true")])
def test_the_operator_may_turn_grpc_fork_support_on(given: str | None, seen: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    if given is not None:
        env["GRPC_ENABLE_FORK_SUPPORT"] = given
    code = "import os, kvserve; print(os.environ['GRPC_ENABLE_FORK_SUPPORT'])"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == seen, out.stderr

"""ClusterSpec -> ClusterPlan: exact argv, ports, core slices and validation (pure)."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import pytest

import kvserve.cli as cli
from kvpool.config import PoolConfig
from kvpool.master import MasterConfig
from kvserve.cluster.plan import ProcessPlan, config_argv, plan_cluster, split_cores
from kvserve.cluster.redis import RedisConfig, redis_auth_conf, redis_command
from kvserve.cluster.redis_acl import node_users, role_password
from kvserve.cluster.spec import ClusterSpec, new_cluster_config
from kvserve.settings import config_from_args
from proto.grants import grant
from proto.registry import ClusterConfig
from workers.config import EngineConfig


def registry(role: str) -> list[str]:
    """The registry flags of a ``role`` process: its own Redis user (redis_acl); secrets
    travel in the environment."""
    flags = ["--redis-url", "redis://127.0.0.1:6379/0", "--cluster", "kvserve"]
    flags += ["--heartbeat-s", "1.0", "--heartbeat-ttl-s", "3.0", "--redis-username", role]
    flags += ["--peer-timeout-s", "5.0", "--grpc-tls-cert", "", "--grpc-tls-key", ""]
    return [*flags, "--grpc-tls-ca", "", "--hash-algorithm", "sha256"]


@dataclasses.dataclass(frozen=True)
class Example:
    some_name: str = "a"
    count: int = 2
    ratio: float = 0.5
    on: bool = True
    off: bool = False


def flag(argv: tuple[str, ...], name: str) -> str:
    return argv[argv.index(name) + 1]


CLUSTER_FIELDS = {f.name for f in dataclasses.fields(ClusterConfig)}


def spec(**kw: Any) -> ClusterSpec:
    """A spec of ``kw``: its :class:`ClusterConfig` fields (``cluster_name`` for its
    ``cluster``) go to the spec's held config, the rest to the spec."""
    kw.setdefault("engine", EngineConfig(model="/m"))
    held = {k: kw.pop(k) for k in list(kw) if k in CLUSTER_FIELDS}
    if "cluster_name" in kw:
        held["cluster"] = kw.pop("cluster_name")
    return ClusterSpec(python="py", cluster=new_cluster_config(**held), **kw)


def worker_argv(role: str, port: int, name: str, threads: int) -> list[str]:
    """Every engine and pool field is forwarded (their values are checked below and by the
    round trip through the real CLI); the registry flags are the contract, spelled out."""
    head = ["py", "-m", "kvserve", "worker", "--role", role, "--worker-host", "127.0.0.1"]
    head += ["--worker-port", str(port), "--worker-id", name]
    engine = config_argv(EngineConfig(model="/m", threads=threads))
    return [*head, *engine, *config_argv(spec().pool_config(name)), *registry("worker")]


def test_config_argv_spells_every_field_as_its_flag() -> None:
    assert config_argv(Example()) == [
        *["--some-name", "a", "--count", "2", "--ratio", "0.5", "--on", "--no-off"]
    ]


def test_two_cores_one_prefill_one_decode_pins_one_core_each() -> None:
    s = spec()
    plan = plan_cluster(s, [0, 1])
    prefill, decode = plan.workers
    assert list(prefill.argv) == worker_argv("prefill", 50061, "prefill-0", 1)
    assert list(decode.argv) == worker_argv("decode", 50062, "decode-0", 1)
    assert (flag(decode.argv, "--model"), flag(decode.argv, "--threads")) == ("/m", "1")
    assert flag(decode.argv, "--pool-master") == "127.0.0.1:50051"
    assert flag(decode.argv, "--pool-metadata-server") == "http://127.0.0.1:8080/metadata"
    assert flag(decode.argv, "--pool-local-hostname") == "127.0.0.1"
    assert flag(decode.argv, "--pool-segment-mib") == "256"
    assert (prefill.cores, decode.cores) == ((0,), (1,))
    assert dict(decode.env) == {
        **{"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"},
        "KVSERVE_REDIS_PASSWORD": role_password(s.cluster.redis_password, "worker"),
        "KVSERVE_CLUSTER_SECRET": grant(s.cluster.cluster_secret, "worker"),
    }
    assert decode.address == "127.0.0.1:50062"
    assert not plan.shared_cores and plan.notes == ()
    router = ["py", "-m", "kvserve", "router", "--router-host", "127.0.0.1"]
    router += ["--router-port", "8000", "--router-id", "router", *registry("router")]
    router += config_argv(spec().pool_config("router"))
    router += ["--tokenizer-dir", "/m"]
    assert list(plan.router.argv) == router
    for process in (plan.router, decode):  # the pool settings say where the master's metrics are
        assert flag(process.argv, "--master-metrics-url") == "http://127.0.0.1:9003/metrics"
    assert plan.router.cores == () and plan.router.port == 8000


def test_more_workers_than_cores_share_all_cores() -> None:
    plan = plan_cluster(spec(prefill=2), [0, 1])
    assert [w.name for w in plan.workers] == ["prefill-0", "prefill-1", "decode-0"]
    assert [w.port for w in plan.workers] == [50061, 50062, 50063]
    assert plan.shared_cores and all(w.cores == (0, 1) for w in plan.workers)
    assert all(flag(w.argv, "--threads") == "1" for w in plan.workers)
    assert "3 workers share 2 cores" in plan.notes[0]


def test_sixteen_cores_are_split_into_contiguous_slices() -> None:
    plan = plan_cluster(spec(), range(16))
    assert [w.cores for w in plan.workers] == [tuple(range(8)), tuple(range(8, 16))]
    assert all(flag(w.argv, "--threads") == "8" for w in plan.workers)
    plan = plan_cluster(spec(prefill=3, decode=2), range(16))
    assert [len(w.cores) for w in plan.workers] == [4, 3, 3, 3, 3]
    assert sorted(c for w in plan.workers for c in w.cores) == list(range(16))


def test_threads_and_pinning_overrides() -> None:
    unpinned = plan_cluster(spec(pin_cores=False), range(16))
    assert all(w.cores == () for w in unpinned.workers)
    assert flag(unpinned.workers[0].argv, "--threads") == "8"
    for kw in ({"threads_per_worker": 3}, {"engine": EngineConfig(model="/m", threads=3)}):
        w = plan_cluster(spec(**kw), range(16)).workers[0]
        assert flag(w.argv, "--threads") == "3" and len(w.cores) == 8


def test_mixed_only_without_pool() -> None:
    plan = plan_cluster(
        spec(prefill=0, decode=0, mixed=2, use_pool=False, policy="round_robin"), [0, 1]
    )
    assert [w.name for w in plan.workers] == ["mixed-0", "mixed-1"]
    assert "--no-use-pool" in plan.workers[0].argv
    assert "--pool-master" not in plan.workers[0].argv
    assert plan.router.argv[-5:-2] == ("--no-pool-lookup", "--policy", "round_robin")


def test_router_options_and_extra_args_come_last() -> None:
    s = spec(disagg_threshold_tokens=0, router_args=("--x",), worker_args=("--y",))
    plan = plan_cluster(s, [0, 1])
    assert plan.router.argv[-5:] == (
        "--disagg-threshold-tokens",
        "0",
        "--tokenizer-dir",
        "/m",
        "--x",
    )
    assert plan.workers[0].argv[-1] == "--y"


def test_pool_and_registry_point_at_this_clusters_services() -> None:
    pool = PoolConfig(pool_master="elsewhere:1", pool_local_hostname="10.0.0.1")
    s = spec(pool=pool, redis_port=7000, redis_password="pw", cluster_name="c1")
    assert s.pool_config("decode-0").pool_master == s.master.rpc_address
    assert s.pool_config("decode-0").pool_local_hostname == "127.0.0.1"
    assert s.cluster_config.redis_url == "redis://127.0.0.1:7000/0"
    assert s.cluster_config.redis_password == "pw" and "pw" not in repr(s.cluster_config)
    assert s.cluster_config.cluster == "c1"
    plan = plan_cluster(s, [0, 1])
    for p in (*plan.workers, plan.router):  # never on a command line
        role = "router" if p.role == "router" else "worker"  # its own user, not the admin's
        assert ("KVSERVE_REDIS_PASSWORD", role_password("pw", role)) in p.env
        assert "pw" not in p.argv and "pw" not in repr(p) and "pw" not in dict(p.env).values()


def test_free_ports_are_distinct_and_cover_every_process() -> None:
    s = spec(prefill=2, decode=2).with_free_ports()
    ports = [s.router_port, s.redis_port, *s.worker_ports]
    m = s.master
    ports += [m.master_port, m.master_metadata_port, m.master_metrics_port]
    assert len(set(ports)) == 9 and len(s.worker_ports) == 4
    assert [w.port for w in plan_cluster(s, [0]).workers] == list(s.worker_ports)
    assert not s.worker_metrics_ports and all(
        not w.metrics_port for w in plan_cluster(s, [0]).workers
    )


def test_worker_metrics_ports() -> None:
    s = spec(prefill=1, decode=2, worker_metrics_base_port=9100)
    workers = plan_cluster(s, [0]).workers
    assert [w.metrics_port for w in workers] == [9100, 9101, 9102]
    assert workers[2].argv[-2:] == ("--worker-metrics-port", "9102")
    assert workers[0].metrics_url == "http://127.0.0.1:9100/metrics"
    free = s.with_free_ports()
    ports = [*free.worker_ports, *free.worker_metrics_ports, free.router_port]
    assert len(free.worker_metrics_ports) == 3 and len(set(ports)) == 7
    assert [w.metrics_port for w in plan_cluster(free, [0]).workers] == list(
        free.worker_metrics_ports
    )


def test_split_cores() -> None:
    assert split_cores([3, 1, 2], 2) == ([(1, 2), (3,)], False)
    assert split_cores([0], 2) == ([(0,), (0,)], True)


def test_redis_command() -> None:
    argv = redis_command(RedisConfig(port=7001), "redis-server")
    assert argv == [
        *["redis-server", "--port", "7001", "--bind", "127.0.0.1", "--save", ""],
        *["--appendonly", "no", "--protected-mode", "yes"],
    ]
    with_password = redis_command(
        RedisConfig(port=7001, password="s3"), "r"
    )  # credentials from stdin
    assert with_password == ["r", *argv[1:], "-"] and "s3" not in " ".join(with_password)
    roles = node_users('a"b', "kvserve", ha=False)  # each role's user (test_redis_roles.py)
    assert redis_auth_conf(RedisConfig(password='a"b')) == 'requirepass "a\\"b"\n' + roles
    assert redis_auth_conf(RedisConfig(password="p", username="u")) == (
        'user default off\nuser u on ">p" ~* &* +@all\n' + node_users("p", "kvserve", False)
    )
    assert redis_auth_conf(RedisConfig(port=7001)) == ""
    with pytest.raises(ValueError, match="role"):
        RedisConfig(password="p", username="worker")
    with pytest.raises(ValueError, match="cluster name"):
        RedisConfig(cluster="a b*")


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"decode": 0}, "decode-capable"),
        ({"prefill": 0, "decode": 0, "mixed": 0}, "decode-capable"),
        ({"decode": -1, "mixed": 1}, ">= 0"),
        ({"decode": 0, "mixed": 1}, "set decode >= 1"),
        ({"use_pool": False}, "through the pool"),
        ({"router_port": 50062}, "distinct"),
        ({"redis_port": 70000}, "1..65535"),
        ({"master": MasterConfig(master_port=8000)}, "distinct"),
        ({"worker_ports": (1, 2, 3)}, "3 ports for 2 workers"),
        ({"worker_metrics_ports": (1,)}, "1 ports for 2 workers"),
        ({"worker_metrics_base_port": 50062}, "distinct"),
        ({"threads_per_worker": -1}, "threads_per_worker"),
        ({"cores": (0, 0)}, "distinct CPU"),
        ({"cluster_name": "a:b"}, "cluster"),
        ({"heartbeat_s": 5.0}, "heartbeat"),
        ({"disagg_threshold_tokens": -1}, "disagg_threshold_tokens"),
        ({"stop_grace_s": 0.0}, "positive"),
        ({"master": MasterConfig(master_host="10.0.0.9")}, "stays on loopback"),
    ],
)
def test_invalid_specs_say_what_to_change(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        spec(**kw)


def test_only_the_front_leaves_loopback_whatever_host_says() -> None:
    """``host`` is where clients reach the cluster: the router binds it, or nginx in front
    of several routers; the workers' gRPC and /metrics, the routers behind nginx, Redis and
    the pool stay on loopback (issue 38: nothing internal on the LAN)."""
    s = spec(host="10.0.0.9")
    plan = plan_cluster(s, [0, 1])
    decode = plan.workers[1]
    assert (flag(decode.argv, "--worker-host"), s.router_url) == (
        "127.0.0.1",
        "http://10.0.0.9:8000",
    )
    assert decode.metrics_url in ("", f"http://127.0.0.1:{decode.metrics_port}/metrics")
    assert flag(decode.argv, "--pool-local-hostname") == "127.0.0.1"
    assert s.redis_config.host == s.pool_master.master_host == s.host_of("redis") == "127.0.0.1"
    (router,) = plan.routers
    assert flag(router.argv, "--router-host") == "10.0.0.9" and "--allowed-hosts" not in router.argv
    several = plan_cluster(spec(host="10.0.0.9", router_ports=(8001, 8002)), [0, 1])
    for behind in several.routers:
        assert flag(behind.argv, "--router-host") == "127.0.0.1"
        assert flag(behind.argv, "--allowed-hosts") == "10.0.0.9"  # clients name the front


def test_no_pool_ports_are_checked_without_the_pool() -> None:
    s = spec(prefill=0, mixed=1, decode=0, use_pool=False, master=MasterConfig(master_port=8000))
    assert plan_cluster(s, [0]).workers[0].name == "mixed-0"


def _parse(p: ProcessPlan, monkeypatch: pytest.MonkeyPatch) -> argparse.Namespace:
    """``p``'s argv as the real CLI parses it in ``p``'s own environment."""
    assert p.argv[:3] == ("py", "-m", "kvserve")
    for key, value in p.env:
        monkeypatch.setenv(key, value)
    return cli.build_parser().parse_args(list(p.argv[3:]))


def test_argv_round_trips_through_the_real_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once ``worker`` and ``router`` are verbs of kvserve.cli, the argv and the environment
    mean the spec (its secrets included, the cluster secret as each role's grant)."""
    s = spec(disagg_threshold_tokens=64, policy="cache_aware")
    plan = plan_cluster(s, [0, 1])
    ns = _parse(plan.workers[1], monkeypatch)
    assert (ns.role, ns.worker_port, ns.worker_id) == ("decode", 50062, "decode-0")
    assert config_from_args(EngineConfig, ns) == dataclasses.replace(s.engine, threads=1)
    assert config_from_args(PoolConfig, ns) == s.pool_config("decode-0")
    assert config_from_args(ClusterConfig, ns) == granted(s, "worker")
    ns = _parse(plan.router, monkeypatch)
    assert (ns.router_port, ns.policy, ns.disagg_threshold_tokens) == (8000, "cache_aware", 64)
    assert config_from_args(ClusterConfig, ns) == granted(s, "router")
    assert (ns.master_metrics_url, ns.tokenizer_dir) == (s.master.metrics_url, s.model_dir)


def granted(s: ClusterSpec, holder: str) -> ClusterConfig:
    """``s``'s cluster settings as ``holder`` is given them: its grant, its Redis user."""
    return dataclasses.replace(
        s.cluster_config,
        cluster_secret=grant(s.cluster.cluster_secret, holder),
        redis_username=holder,
        redis_password=role_password(s.cluster.redis_password, holder),
    )


def test_secrets_are_made_up_per_spec_and_travel_only_in_the_environment() -> None:
    """Each spec has its own cluster secret and Redis password unless given; every worker
    and the router get the password and a grant of their role (never the secret), through
    the environment only; the router alone gets the API keys (set to '' when there are
    none, so nothing else can stand in)."""
    a, b = spec(api_key="t1=k1,k2"), spec()
    assert a.cluster.cluster_secret != b.cluster.cluster_secret
    assert a.cluster.redis_password != b.cluster.redis_password
    assert len(a.cluster.cluster_secret) == 64 and len(a.cluster.redis_password) >= 32
    assert spec(cluster_secret="x" * 40).cluster_config.cluster_secret == "x" * 40
    secrets = (a.cluster.cluster_secret, a.cluster.redis_password, "k1", "k2")
    plan = plan_cluster(a, [0, 1])
    for p in (*plan.workers, plan.router):
        env = dict(p.env)
        holder = "router" if p is plan.router else "worker"
        assert env["KVSERVE_CLUSTER_SECRET"] == grant(a.cluster.cluster_secret, holder)
        assert env["KVSERVE_REDIS_PASSWORD"] == role_password(a.cluster.redis_password, holder)
        assert flag(p.argv, "--redis-username") == holder
        text = " ".join(p.argv) + repr(p) + repr(a) + repr(a.cluster_config)
        assert not any(secret in text for secret in secrets)
    assert all("KVSERVE_API_KEY" not in dict(w.env) for w in plan.workers)
    assert dict(plan.router.env)["KVSERVE_API_KEY"] == "t1=k1,k2"
    assert dict(plan_cluster(b, [0, 1]).router.env)["KVSERVE_API_KEY"] == ""
    with pytest.raises(ValueError, match="repeats"):
        spec(api_key="k1,k1")
    with pytest.raises(ValueError, match="cluster_secret"):
        spec(cluster_secret="short")

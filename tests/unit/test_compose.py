"""docker-compose.yml (and its RDMA override, and the Prometheus config) agree with the
real CLI: commands parse, variables are settings, health checks and scrape targets dial
where the services listen (tests/unit/compose_files.py reads the files as compose does;
test_compose_secrets.py checks the secrets and ports).

Runs no container: it parses the files with PyYAML and the commands with
``kvserve.cli.build_parser()``, with each service's environment applied (and the secrets its
wrapper would export), so a renamed flag or setting fails here instead of in a deployment.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

import pytest
import yaml  # type: ignore[import-untyped, unused-ignore]

import kvserve.cli as cli
from kvpool.config import PoolConfig
from kvpool.master import MasterConfig
from kvserve.cluster import probe
from kvserve.cluster.redis_ha import SERVICE
from kvserve.settings import config_from_args
from proto.registry import ClusterConfig
from proto.sentinel import SentinelURL
from router.config import RouterConfig
from tests.unit.compose_files import (
    HA_SERVICES,
    ONE_SHOT,
    OURS,
    PROMETHEUS,
    RDMA_ENV,
    RDMA_SERVICES,
    SERVICES,
    compose,
    environment,
    init_secrets,
    ours,
    parse,
    secret_env,
    secret_file,
    variant_service,
    write_secrets,
)
from workers.config import EngineConfig, WorkerConfig

NOT_FLAGS = {"KVSERVE_CACHE_DIR"}  # workers.config.CacheConfig: read from the environment
SETTINGS = (EngineConfig, PoolConfig, ClusterConfig, MasterConfig)
ENV_IN_HELP = re.compile(r"\(env (KVSERVE_[A-Z0-9_]+);")


@pytest.fixture(scope="module")
def secrets_roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_secrets(tmp_path_factory)


def _verb_parser(verb: str) -> argparse.ArgumentParser:
    for action in cli.build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            assert verb in action.choices, f"kvserve.cli has no {verb!r} verb (not wired yet?)"
            parser = action.choices[verb]
            assert isinstance(parser, argparse.ArgumentParser)
            return parser
    raise AssertionError("kvserve.cli.cli.build_parser() has no verbs")


def _honoured(verb: str) -> set[str]:
    """The KVSERVE_* variables a verb reads: those of its settings-dataclass flags."""
    found: set[str] = set()
    for action in _verb_parser(verb)._actions:
        found.update(ENV_IN_HELP.findall(action.help or ""))
    return found


def test_compose_has_the_expected_services() -> None:
    assert {"secrets", "redis", "master", "prefill", "decode", "router"} <= set(SERVICES)
    assert {"master", "prefill", "decode", "router"} <= set(OURS)
    assert {"secrets"} == ONE_SHOT


BOTH = [(v, n) for v in ("base", "rdma") for n in OURS] + [("ha", n) for n in ours(HA_SERVICES)]
"""Each of our services as each way of running the files has it."""


@pytest.mark.parametrize(("variant", "name"), BOTH)
def test_command_parses_with_the_service_environment(
    variant: str, name: str, monkeypatch: pytest.MonkeyPatch, secrets_roots: dict[str, Path]
) -> None:
    ns = parse(variant_service(variant, name), monkeypatch, secrets_roots[variant])
    for cls in (*SETTINGS, RouterConfig):  # they validate the values the verb would use
        if all(hasattr(ns, f.name) for f in dataclasses.fields(cls)):
            config_from_args(cls, ns)


@pytest.mark.parametrize(("variant", "name"), BOTH)
def test_environment_names_are_settings_of_the_verb(
    variant: str, name: str, secrets_roots: dict[str, Path]
) -> None:
    """Also the secrets its wrapper exports: a worker gets no API keys."""
    service = variant_service(variant, name)
    verb = str(service["command"][0])
    names = {*environment(service), *secret_env(service, secrets_roots[variant])}
    unknown = names - NOT_FLAGS - _honoured(verb)
    assert not unknown, f"{name}: `kvserve {verb}` has no setting for {sorted(unknown)}"


def test_entrypoint_exports_only_real_settings() -> None:
    for name in OURS:
        script = " ".join(map(str, SERVICES[name].get("entrypoint") or []))
        verb = str(SERVICES[name]["command"][0])
        exported = set(re.findall(r"export (KVSERVE_[A-Z0-9_]+)=", script))
        if verb != "worker":  # the worker-only lines are guarded by `[ "$1" = worker ]`
            exported.discard("KVSERVE_WORKER_ADVERTISE")
        assert exported <= _honoured(verb), f"{name}: {sorted(exported - _honoured(verb))}"


def test_every_service_has_a_healthcheck_and_known_dependencies() -> None:
    """One-shot services have none; whoever depends on one waits until it succeeded."""
    for name, service in SERVICES.items():
        if name not in ONE_SHOT:
            assert service.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
        deps = service.get("depends_on") or {}
        for dep, how in deps.items() if isinstance(deps, dict) else ((d, {}) for d in deps):
            assert dep in SERVICES, f"{name} depends on unknown service {dep!r}"
            wanted = ["service_completed_successfully"] if dep in ONE_SHOT else [
                "service_started", "service_healthy"
            ]  # fmt: skip
            assert how.get("condition", "service_started") in wanted, (name, dep)


def test_workers_reach_the_cluster_services_by_name() -> None:
    for role in ("prefill", "decode"):
        env = environment(SERVICES[role])
        assert SERVICES[role]["command"][:3] == ["worker", "--role", role]
        assert env["KVSERVE_REDIS_URL"] == SENTINELS
        assert env["KVSERVE_POOL_MASTER"] == "master:50051"
        assert env["KVSERVE_POOL_METADATA_SERVER"] == "http://master:8080/metadata"
        assert env["KVSERVE_WORKER_HOST"] == "0.0.0.0"
        assert "KVSERVE_WORKER_ADVERTISE" not in env  # set per replica by the entrypoint


SENTINELS = "redis+sentinel://sentinel-1:26379,sentinel-2:26379,sentinel-3:26379/kvserve"


def test_redis_is_a_primary_a_replica_and_three_sentinels(tmp_path: Path) -> None:
    """Every client finds Redis through three Sentinels (one URL for all), each a service
    that watches ``redis`` from a copy of the template the secrets service writes; the
    replica follows ``redis``."""
    url = SentinelURL.parse(SENTINELS)
    assert url.service == SERVICE and [port for _, port in url.sentinels] == [26379] * 3
    for host, _ in url.sentinels:
        entry = " ".join(SERVICES[host]["entrypoint"])
        assert "cp /run/kvserve/redis/sentinel.conf /data/sentinel.conf" in entry
        assert "redis-server /data/sentinel.conf --sentinel" in entry
    assert SERVICES["redis-replica"]["command"][2:5] == ["--replicaof", "redis", "6379"]
    init_secrets().write(tmp_path, {})
    template = (tmp_path / "redis/sentinel.conf").read_text()
    assert f"sentinel monitor {SERVICE} redis 6379 2" in template
    assert "port 26379" in template and "sentinel resolve-hostnames yes" in template
    for name in ("prefill", "decode", "router"):
        assert environment(SERVICES[name])["KVSERVE_REDIS_URL"] == SENTINELS


def test_master_service_runs_both_pool_services_where_workers_look(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``kvserve pool`` runs mooncake_master and the HTTP metadata server the workers are
    told about, and publishes nothing on the host."""
    master = SERVICES["master"]
    assert master["command"][0] == "pool"
    cfg = config_from_args(MasterConfig, parse(master, monkeypatch))
    assert cfg.master_host == "0.0.0.0"  # inside the compose network only
    worker_env = environment(SERVICES["decode"])
    assert worker_env["KVSERVE_POOL_MASTER"] == f"master:{cfg.master_port}"
    assert worker_env["KVSERVE_POOL_METADATA_SERVER"] == (
        f"http://master:{cfg.master_metadata_port}/metadata"
    )
    assert "ports" not in master


PROBED = {"worker": "worker", "router": "router", "pool": "pool"}
"""The ``kvserve probe`` service of each verb."""


@pytest.mark.parametrize(("variant", "name"), BOTH)
def test_healthchecks_probe_where_the_service_listens(
    variant: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each of our services' health check is ``kvserve probe <its verb>``, which, with the
    service's environment, dials the address the service binds to."""
    service = variant_service(variant, name)
    verb = str(service["command"][0])
    wrapper = ["sh", "/app/deploy/with-secrets.sh"] if verb != "pool" else []
    assert service["healthcheck"]["test"] == ["CMD", *wrapper, "kvserve", "probe", PROBED[verb]]
    ns = parse(service, monkeypatch)
    got = probe.targets(PROBED[verb])
    if verb == "worker":
        worker = config_from_args(WorkerConfig, ns)
        assert got == (f"{probe.dial_host(worker.worker_host)}:{worker.worker_port}",)
    elif verb == "router":
        router = config_from_args(RouterConfig, ns)
        assert got == (f"http://{probe.dial_host(router.router_host)}:{router.router_port}/health",)
    else:
        cfg = config_from_args(MasterConfig, ns)
        host = probe.dial_host(cfg.master_host)
        if cfg.master_etcd_endpoints:  # HA mode: a standby serves only its metrics
            assert got == (f"{host}:{cfg.master_metrics_port}",)
        else:
            assert got == (f"{host}:{cfg.master_port}", f"{host}:{cfg.master_metadata_port}")


def _scrape_targets() -> dict[str, list[str]]:
    config = yaml.safe_load(PROMETHEUS.read_text())
    found: dict[str, list[str]] = {}
    for job in config["scrape_configs"]:
        targets = [t for s in job.get("static_configs", []) for t in s["targets"]]
        targets += [f"{n}:{d['port']}" for d in job.get("dns_sd_configs", []) for n in d["names"]]
        found[job["job_name"]] = targets
    return found


def test_prometheus_scrapes_every_component_where_it_serves_metrics(
    monkeypatch: pytest.MonkeyPatch, secrets_roots: dict[str, Path]
) -> None:
    """... the router with a key the router accepts, once it has keys."""
    prometheus = SERVICES["prometheus"]
    assert "./deploy/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in prometheus["volumes"]
    assert prometheus["profiles"] == ["monitoring"] == SERVICES["redis-exporter"]["profiles"]
    router = config_from_args(RouterConfig, parse(SERVICES["router"], monkeypatch))
    master = config_from_args(MasterConfig, parse(SERVICES["master"], monkeypatch))
    expected = {
        "router": [f"router:{router.router_port}"],
        "pool": [f"master:{master.master_metrics_port}"],
        "redis": ["redis-exporter:9121"],  # redis_exporter's own port
    }
    workers = expected.setdefault("workers", [])  # one job: the role is a label, not the job
    for role in ("prefill", "decode"):
        worker = config_from_args(WorkerConfig, parse(SERVICES[role], monkeypatch))
        assert worker.worker_metrics_port, f"{role} serves no /metrics"
        workers.append(f"{role}:{worker.worker_metrics_port}")
    assert _scrape_targets() == expected
    for job in yaml.safe_load(PROMETHEUS.read_text())["scrape_configs"]:  # no role by job
        assert not job.get("relabel_configs") and not job.get("metric_relabel_configs")
        assert all(not s.get("labels") for s in job.get("static_configs", []))
    router_pool = config_from_args(PoolConfig, parse(SERVICES["router"], monkeypatch))
    assert router_pool.master_metrics_url == f"http://master:{master.master_metrics_port}/metrics"
    jobs = yaml.safe_load(PROMETHEUS.read_text())["scrape_configs"]
    (job,) = (j for j in jobs if j["job_name"] == "router")
    assert job["authorization"]["type"] == "Bearer"
    key = secret_file(prometheus, job["authorization"]["credentials_file"], secrets_roots["base"])
    keyed = config_from_args(
        RouterConfig, parse(SERVICES["router"], monkeypatch, secrets_roots["base"])
    )
    assert keyed.api_keys.tenant_of(key) == "prometheus"
    assert keyed.api_keys.tenant_of("k1") == "alice"


def test_rdma_override_puts_workers_on_the_nic_and_the_pool_on_rdma(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster_host, node = RDMA_ENV["KVSERVE_CLUSTER_HOST"], RDMA_ENV["KVSERVE_NODE_IP"]
    for role in ("prefill", "decode"):
        service = RDMA_SERVICES[role]
        assert service["network_mode"] == "host" and "IPC_LOCK" in service["cap_add"]
        assert "/dev/infiniband:/dev/infiniband" in service["devices"]
        ns = parse(service, monkeypatch)
        pool, worker = config_from_args(PoolConfig, ns), config_from_args(WorkerConfig, ns)
        assert (pool.pool_protocol, pool.pool_rdma_devices) == ("rdma", "mlx5_1")
        assert pool.pool_local_hostname == node == worker.worker_host
        assert worker.worker_advertise == f"{node}:{worker.worker_port}"
        assert pool.pool_master == f"{cluster_host}:50051"
        cluster = config_from_args(ClusterConfig, ns)
        assert cluster.redis_url.startswith(f"redis://{cluster_host}:")
    for name in ("redis", "master"):  # published on the private address only
        assert all(str(p).startswith(f"{cluster_host}:") for p in RDMA_SERVICES[name]["ports"])
    assert RDMA_SERVICES["redis"]["command"] == SERVICES["redis"]["command"]  # its password


def test_router_is_published_and_models_are_a_volume() -> None:
    assert any(str(p).endswith(":8000") for p in SERVICES["router"]["ports"])
    assert "models" in compose()["volumes"]
    for name in OURS:
        assert "models:/models" in SERVICES[name]["volumes"]

"""docker-compose.yml (and its RDMA override, and the Prometheus config) agree with the
real CLI: commands parse, variables are settings, health checks and scrape targets dial
where the services listen.

Runs no container: it parses the files with PyYAML and the commands with
``kvserve.cli.build_parser()``, with each service's environment applied, so a renamed flag
or setting fails here instead of in a deployment. The override is merged onto the base
file the way ``docker compose -f a -f b`` does for the keys it uses (mappings merge, other
values replace), with ``${VAR...}`` filled from :data:`RDMA_ENV`.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped, unused-ignore]

import kvserve.cli as cli
from kvpool.config import PoolConfig
from kvpool.master import MasterConfig
from kvserve import probe
from kvserve.settings import config_from_args
from proto.registry import ClusterConfig
from router.config import RouterConfig
from workers.config import EngineConfig, WorkerConfig

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
RDMA = ROOT / "docker-compose.rdma.yml"
PROMETHEUS = ROOT / "deploy" / "prometheus.yml"
RDMA_ENV = {
    "KVSERVE_CLUSTER_HOST": "10.0.0.10",
    "KVSERVE_NODE_IP": "10.0.0.11",
    "KVSERVE_RDMA_DEVICES": "mlx5_1",
    "KVSERVE_REDIS_PASSWORD": "s3cret",
}
NOT_FLAGS = {"KVSERVE_CACHE_DIR"}  # read by workers.model.prepare, not a setting
SETTINGS = (EngineConfig, PoolConfig, ClusterConfig, MasterConfig)
ENV_IN_HELP = re.compile(r"\(env (KVSERVE_[A-Z0-9_]+);")


def _compose(path: Path = COMPOSE) -> dict[str, Any]:
    text = path.read_text()
    if path == RDMA:  # compose's interpolation: ${NAME}, ${NAME:?message}, ${NAME:-default}
        text = re.sub(r"\$\{([A-Z_]+)[^}]*\}", lambda m: RDMA_ENV[m.group(1)], text)
    data = yaml.safe_load(text.replace("$$", "$"))
    assert isinstance(data, dict)
    return data


def _merged(base: Any, override: Any) -> Any:
    if not (isinstance(base, dict) and isinstance(override, dict)):
        return override
    out = dict(base)
    for key, value in override.items():
        out[key] = _merged(base[key], value) if key in base else value
    return out


SERVICES: dict[str, dict[str, Any]] = _compose()["services"]
RDMA_SERVICES: dict[str, dict[str, Any]] = _merged(SERVICES, _compose(RDMA)["services"])
OURS = sorted(name for name, s in SERVICES.items() if "build" in s)


def _environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}


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
    assert {"redis", "master", "prefill", "decode", "router"} <= set(SERVICES)
    assert {"master", "prefill", "decode", "router"} <= set(OURS)


def _parse(service: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> argparse.Namespace:
    """The service's command as its verb parses it, with the service's environment set."""
    for key, value in _environment(service).items():
        monkeypatch.setenv(key, value)
    command = service["command"]
    assert isinstance(command, list), "a command must be an argv list"
    return cli.build_parser().parse_args([str(a) for a in command])


BOTH = [("base", n) for n in OURS] + [("rdma", n) for n in OURS]


def _service(variant: str, name: str) -> dict[str, Any]:
    return (SERVICES if variant == "base" else RDMA_SERVICES)[name]


@pytest.mark.parametrize(("variant", "name"), BOTH)
def test_command_parses_with_the_service_environment(
    variant: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ns = _parse(_service(variant, name), monkeypatch)
    for cls in SETTINGS:  # the dataclasses validate the values the verb would use
        if all(hasattr(ns, f.name) for f in dataclasses.fields(cls)):
            config_from_args(cls, ns)


@pytest.mark.parametrize(("variant", "name"), BOTH)
def test_environment_names_are_settings_of_the_verb(variant: str, name: str) -> None:
    service = _service(variant, name)
    verb = str(service["command"][0])
    unknown = set(_environment(service)) - NOT_FLAGS - _honoured(verb)
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
    for name, service in SERVICES.items():
        assert service.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
        deps = service.get("depends_on") or {}
        for dep, how in deps.items() if isinstance(deps, dict) else ((d, {}) for d in deps):
            assert dep in SERVICES, f"{name} depends on unknown service {dep!r}"
            assert how.get("condition", "service_started") in (
                "service_started",
                "service_healthy",
                "service_completed_successfully",
            )


def test_workers_reach_the_cluster_services_by_name() -> None:
    for role in ("prefill", "decode"):
        env = _environment(SERVICES[role])
        assert SERVICES[role]["command"][:3] == ["worker", "--role", role]
        assert env["KVSERVE_REDIS_URL"] == "redis://redis:6379/0"
        assert env["KVSERVE_POOL_MASTER"] == "master:50051"
        assert env["KVSERVE_POOL_METADATA_SERVER"] == "http://master:8080/metadata"
        assert env["KVSERVE_WORKER_HOST"] == "0.0.0.0"
        assert "KVSERVE_WORKER_ADVERTISE" not in env  # set per replica by the entrypoint


def test_master_service_runs_both_pool_services_where_workers_look(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``kvserve pool`` runs mooncake_master and the HTTP metadata server the workers are
    told about, and publishes nothing on the host."""
    master = SERVICES["master"]
    assert master["command"][0] == "pool"
    cfg = config_from_args(MasterConfig, _parse(master, monkeypatch))
    assert cfg.master_host == "0.0.0.0"  # inside the compose network only
    worker_env = _environment(SERVICES["decode"])
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
    service = _service(variant, name)
    verb = str(service["command"][0])
    assert service["healthcheck"]["test"] == ["CMD", "kvserve", "probe", PROBED[verb]]
    ns = _parse(service, monkeypatch)
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
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    prometheus = SERVICES["prometheus"]
    assert "./deploy/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in prometheus["volumes"]
    assert prometheus["profiles"] == ["monitoring"] == SERVICES["redis-exporter"]["profiles"]
    router = config_from_args(RouterConfig, _parse(SERVICES["router"], monkeypatch))
    master = config_from_args(MasterConfig, _parse(SERVICES["master"], monkeypatch))
    expected = {
        "router": [f"router:{router.router_port}"],
        "pool": [f"master:{master.master_metrics_port}"],
        "redis": ["redis-exporter:9121"],  # redis_exporter's own port
    }
    for role in ("prefill", "decode"):
        worker = config_from_args(WorkerConfig, _parse(SERVICES[role], monkeypatch))
        assert worker.worker_metrics_port, f"{role} serves no /metrics"
        expected[role] = [f"{role}:{worker.worker_metrics_port}"]
    assert _scrape_targets() == expected
    assert router.master_metrics_url == f"http://master:{master.master_metrics_port}/metrics"


def test_rdma_override_puts_workers_on_the_nic_and_the_pool_on_rdma(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster_host, node = RDMA_ENV["KVSERVE_CLUSTER_HOST"], RDMA_ENV["KVSERVE_NODE_IP"]
    for role in ("prefill", "decode"):
        service = RDMA_SERVICES[role]
        assert service["network_mode"] == "host" and "IPC_LOCK" in service["cap_add"]
        assert "/dev/infiniband:/dev/infiniband" in service["devices"]
        ns = _parse(service, monkeypatch)
        pool, worker = config_from_args(PoolConfig, ns), config_from_args(WorkerConfig, ns)
        assert (pool.pool_protocol, pool.pool_rdma_devices) == ("rdma", "mlx5_1")
        assert pool.pool_local_hostname == node == worker.worker_host
        assert worker.worker_advertise == f"{node}:{worker.worker_port}"
        assert pool.pool_master == f"{cluster_host}:50051"
        cluster = config_from_args(ClusterConfig, ns)
        assert cluster.redis_url.startswith(f"redis://{cluster_host}:")
        assert cluster.redis_password == RDMA_ENV["KVSERVE_REDIS_PASSWORD"]
    for name in ("redis", "master"):  # published on the private address only
        assert all(str(p).startswith(f"{cluster_host}:") for p in RDMA_SERVICES[name]["ports"])
    assert "--requirepass" in " ".join(RDMA_SERVICES["redis"]["command"])


def test_router_is_published_and_models_are_a_volume() -> None:
    assert any(str(p).endswith(":8000") for p in SERVICES["router"]["ports"])
    assert "models" in _compose()["volumes"]
    for name in OURS:
        assert "models:/models" in SERVICES[name]["volumes"]

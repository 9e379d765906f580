"""docker-compose.yml agrees with the real CLI: commands parse, variables are settings.

Runs no container: it parses the file with PyYAML and the commands with
``kvserve.cli.cli.build_parser()``, with each service's environment applied, so a renamed flag
or setting fails here instead of in a deployment.
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
from kvserve.settings import config_from_args
from proto.registry import ClusterConfig
from workers.config import EngineConfig

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"
NOT_FLAGS = {"KVSERVE_CACHE_DIR"}  # read by workers.model.prepare, not a setting
SETTINGS = (EngineConfig, PoolConfig, ClusterConfig, MasterConfig)
ENV_IN_HELP = re.compile(r"\(env (KVSERVE_[A-Z0-9_]+);")


def _compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


SERVICES: dict[str, dict[str, Any]] = _compose()["services"]
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


@pytest.mark.parametrize("name", OURS)
def test_command_parses_with_the_service_environment(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = SERVICES[name]
    for key, value in _environment(service).items():
        monkeypatch.setenv(key, value)
    command = service["command"]
    assert isinstance(command, list), f"{name}: command must be an argv list"
    ns = cli.build_parser().parse_args([str(a) for a in command])
    for cls in SETTINGS:  # the dataclasses validate the values the verb would use
        if all(hasattr(ns, f.name) for f in dataclasses.fields(cls)):
            config_from_args(cls, ns)


@pytest.mark.parametrize("name", OURS)
def test_environment_names_are_settings_of_the_verb(name: str) -> None:
    service = SERVICES[name]
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


def test_master_service_runs_both_pool_services_and_checks_their_ports() -> None:
    """``kvserve pool`` runs mooncake_master and the HTTP metadata server the workers are
    told about; the healthcheck probes both on the ports the workers use."""
    master = SERVICES["master"]
    assert master["command"][0] == "pool"
    ns = cli.build_parser().parse_args([str(a) for a in master["command"]])
    cfg = config_from_args(MasterConfig, ns)
    assert cfg.master_host == "0.0.0.0"  # inside the compose network only
    worker_env = _environment(SERVICES["decode"])
    assert worker_env["KVSERVE_POOL_MASTER"] == f"master:{cfg.master_port}"
    assert worker_env["KVSERVE_POOL_METADATA_SERVER"] == (
        f"http://master:{cfg.master_metadata_port}/metadata"
    )
    probe = " ".join(map(str, master["healthcheck"]["test"]))
    for port in (cfg.master_port, cfg.master_metadata_port):
        assert str(port) in probe, f"the master's healthcheck does not probe port {port}"
    assert "ports" not in master  # nothing of the pool is published on the host


def test_router_is_published_and_models_are_a_volume() -> None:
    assert any(str(p).endswith(":8000") for p in SERVICES["router"]["ports"])
    assert "models" in _compose()["volumes"]
    for name in OURS:
        assert "models:/models" in SERVICES[name]["volumes"]

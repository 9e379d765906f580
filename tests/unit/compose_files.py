"""Reading docker-compose.yml, its RDMA and HA overrides and the compose secrets as compose
would, for tests/unit/test_compose.py and test_compose_secrets.py (no container runs).

An override is merged onto the base file the way ``docker compose -f a -f b`` does for the
keys it uses (mappings merge, other values replace, ``!reset`` removes the base's value;
``extends`` starts a service from another file's); ``${VAR...}`` is filled as compose
does, from :data:`RDMA_ENV` for the override and from nothing for the base file. The
secrets are what deploy/init_secrets.py (the one-shot ``secrets`` service) writes, and what
deploy/with-secrets.sh then exports in a service that runs through it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped, unused-ignore]

import kvserve.cli as cli

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
RDMA = ROOT / "docker-compose.rdma.yml"
HA = ROOT / "docker-compose.ha.yml"
PROMETHEUS = ROOT / "deploy" / "prometheus.yml"
DATASOURCES = ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml"
INIT = ROOT / "deploy" / "init_secrets.py"
WRAPPER = ROOT / "deploy" / "with-secrets.sh"
RDMA_ENV = {
    "KVSERVE_CLUSTER_HOST": "10.0.0.10",
    "KVSERVE_NODE_IP": "10.0.0.11",
    "KVSERVE_RDMA_DEVICES": "mlx5_1",
    "KVSERVE_REDIS_PASSWORD": "s3cret",
    "KVSERVE_CLUSTER_SECRET": "c" * 64,
}
INTERPOLATED = re.compile(r"(?<!\$)\$\{([A-Z_]+)(?::([-?])([^}]*))?\}")
SECRETS_DIR = "/run/kvserve"
LOADED = re.findall(r"^load (KVSERVE_[A-Z_]+) (\S+)$", WRAPPER.read_text(), re.M)
"""What deploy/with-secrets.sh exports, in order: (variable, file under :data:`SECRETS_DIR`)."""


def interpolate(text: str, env: Mapping[str, str]) -> str:
    """compose's ``${NAME}``, ``${NAME:-default}`` and ``${NAME:?message}`` (an error when
    NAME is unset or empty), and ``$$`` for ``$``."""

    def value(m: re.Match[str]) -> str:
        name, kind, rest = m.groups()
        if env.get(name):
            return env[name]
        if kind == "?":
            raise ValueError(f"compose refuses to start: {rest}")
        return rest if kind == "-" else ""

    return INTERPOLATED.sub(value, text).replace("$$", "$")


RESET = object()
"""What compose's ``!reset`` tag reads as: the key is removed from the merged service."""


class _Loader(yaml.SafeLoader):  # type: ignore[misc]
    """PyYAML's safe loader, knowing compose's ``!reset``."""


_Loader.add_constructor("!reset", lambda loader, node: RESET)


def compose(path: Path = COMPOSE, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    variables = (RDMA_ENV if path == RDMA else {}) if env is None else env
    data = yaml.load(interpolate(path.read_text(), variables), Loader=_Loader)
    assert isinstance(data, dict)
    return data


def merged(base: Any, override: Any) -> Any:
    if not (isinstance(base, dict) and isinstance(override, dict)):
        return override
    out = dict(base)
    for key, value in override.items():
        if value is RESET:
            out.pop(key, None)
        else:
            out[key] = merged(base[key], value) if key in base else value
    return out


def with_extends(services: dict[str, Any]) -> dict[str, Any]:
    """Each service that ``extends`` another file's service: that service, merged over."""
    out = {}
    for name, service in services.items():
        parent = service.get("extends")
        if parent is not None:
            base = compose(ROOT / parent["file"])["services"][parent["service"]]
            service = merged(base, {k: v for k, v in service.items() if k != "extends"})
        out[name] = service
    return out


SERVICES: dict[str, dict[str, Any]] = compose()["services"]
RDMA_SERVICES: dict[str, dict[str, Any]] = merged(SERVICES, compose(RDMA)["services"])
HA_SERVICES: dict[str, dict[str, Any]] = with_extends(merged(SERVICES, compose(HA)["services"]))
ONE_SHOT = {name for name, s in SERVICES.items() if s.get("restart") == "no"}


def init_secrets() -> Any:
    """deploy/init_secrets.py as a module."""
    spec = importlib.util.spec_from_file_location("init_secrets", INIT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def mounts(service: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """``target -> (source, mode)`` of a service's volumes."""
    found = {}
    for entry in service.get("volumes") or []:
        source, target, *mode = str(entry).split(":")
        found[target] = (source, mode[0] if mode else "rw")
    return found


def secret_env(service: dict[str, Any], root: Path) -> dict[str, str]:
    """What deploy/with-secrets.sh exports in ``service`` (nothing unless it runs through
    it): each :data:`LOADED` file whose directory the service mounts, read from ``root``."""
    if "/app/deploy/with-secrets.sh" not in (service.get("entrypoint") or []):
        return {}
    mounted = set(mounts(service))
    return {
        var: (root / name).read_text()
        for var, name in LOADED
        if f"{SECRETS_DIR}/{name.split('/')[0]}" in mounted
    }


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}


def parse(
    service: dict[str, Any], monkeypatch: pytest.MonkeyPatch, root: Path | None = None
) -> argparse.Namespace:
    """The service's command as its verb parses it, with the service's environment set
    (and, given the secrets' ``root``, what its wrapper exports)."""
    exported = secret_env(service, root) if root is not None else {}
    for key, value in {**environment(service), **exported}.items():
        monkeypatch.setenv(key, value)
    command = service["command"]
    assert isinstance(command, list), "a command must be an argv list"
    return cli.build_parser().parse_args([str(a) for a in command])


VARIANTS = {"base": SERVICES, "rdma": RDMA_SERVICES, "ha": HA_SERVICES}
"""Every way the files are run: the base file, and each override merged onto it."""


def variant_service(variant: str, name: str) -> dict[str, Any]:
    return VARIANTS[variant][name]


def ours(services: dict[str, dict[str, Any]]) -> list[str]:
    """The services that run ``kvserve <verb>`` (one-shot ones do not)."""
    return sorted(n for n, s in services.items() if "build" in s and s.get("restart") != "no")


OURS = ours(SERVICES)


def secret_file(reader: dict[str, Any], path: str, root: Path) -> str:
    """The content of the secrets file a service reads at ``path``, after checking that it
    mounts, read-only, the volume the ``secrets`` service writes that file into."""
    directory = path.rsplit("/", 1)[0]
    writer = mounts(SERVICES["secrets"])
    assert directory in writer and mounts(reader).get(directory) == (writer[directory][0], "ro")
    relative = path.removeprefix(SECRETS_DIR + "/")
    assert relative in init_secrets().FILES
    return (root / relative).read_text()


def write_secrets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The files the ``secrets`` service writes, by variant (the override gives secrets;
    the base file, with API keys given here, makes up the rest)."""
    module = init_secrets()
    roots = {"base": tmp_path_factory.mktemp("base"), "rdma": tmp_path_factory.mktemp("rdma")}
    module.write(roots["base"], {"KVSERVE_API_KEY": "alice=k1"})
    module.write(roots["rdma"], RDMA_ENV)
    return {**roots, "ha": roots["base"]}


def prometheus_login(root: Path) -> dict[str, Any]:
    """The compose Prometheus's login as each reader finds it: the bcrypt hash in the web
    config its command names, the user and the password file of Grafana's data source, the
    credential its own health check sends (each file checked to be mounted read-only where
    it is read)."""
    prometheus, grafana = SERVICES["prometheus"], SERVICES["grafana"]
    (flag,) = [a for a in prometheus["command"] if a.startswith("--web.config.file=")]
    users = json.loads(secret_file(prometheus, flag.split("=", 1)[1], root))["basic_auth_users"]
    (source,) = yaml.safe_load(DATASOURCES.read_text())["datasources"]
    path = re.fullmatch(r"\$__file\{(.+)\}", source["secureJsonData"]["basicAuthPassword"])
    assert path and source["basicAuth"] is True
    health = re.search(r"\$\(cat (\S+)\)", str(prometheus["healthcheck"]["test"]))
    assert health and "Authorization: Basic" in str(prometheus["healthcheck"]["test"])
    return {
        "user": source["basicAuthUser"],
        "hash": users[source["basicAuthUser"]].encode(),
        "password": secret_file(grafana, path.group(1), root).encode(),
        "health": secret_file(prometheus, health.group(1), root),
    }

"""The compose files are safe: the one-shot ``secrets`` service (deploy/init_secrets.py, run
here for real) makes up the cluster secret and the Redis password once, keeps them, and
lets given ones win; each secret is mounted, read-only, only into the services that read
it (through deploy/with-secrets.sh or their own file settings), the cluster secret into no
service at all (workers and the router get their role's grant); Redis requires its
password; the RDMA machines must be given the shared secrets; nothing but the router and
Prometheus is published, and those on loopback only (tests/unit/compose_files.py reads the
files as compose does; no container runs)."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
from pathlib import Path

import bcrypt
import pytest

from kvserve.cluster.redis_acl import EXPORTER, REPLICA, SENTINEL, role_password
from kvserve.settings import config_from_args
from proto.grants import grant
from proto.registry import ClusterConfig
from router.api.auth import parse_api_keys
from tests.unit.compose_files import (
    INIT,
    ONE_SHOT,
    RDMA,
    RDMA_ENV,
    RDMA_SERVICES,
    ROOT,
    SECRETS_DIR,
    SERVICES,
    compose,
    environment,
    init_secrets,
    mounts,
    parse,
    prometheus_login,
    secret_env,
    secret_file,
    write_secrets,
)


@pytest.fixture(scope="module")
def secrets_roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_secrets(tmp_path_factory)


@pytest.mark.parametrize("missing", ["KVSERVE_CLUSTER_SECRET", "KVSERVE_REDIS_PASSWORD"])
def test_rdma_machines_must_be_given_the_shared_secrets(
    missing: str, monkeypatch: pytest.MonkeyPatch, secrets_roots: dict[str, Path]
) -> None:
    """Each machine's own ``secrets`` service would make up different ones: compose refuses
    to start without them, and every worker and the router get the given password and a
    grant cut from the given secret."""
    env = {k: v for k, v in RDMA_ENV.items() if k != missing}
    with pytest.raises(ValueError, match=missing):
        compose(RDMA, env)
    for name in ("prefill", "decode", "router"):
        ns = parse(RDMA_SERVICES[name], monkeypatch, secrets_roots["rdma"])
        cluster = config_from_args(ClusterConfig, ns)
        holder = "router" if name == "router" else "worker"
        assert cluster.redis_username == holder
        assert cluster.redis_password == role_password(RDMA_ENV["KVSERVE_REDIS_PASSWORD"], holder)
        assert cluster.cluster_secret == grant(RDMA_ENV["KVSERVE_CLUSTER_SECRET"], holder)


def test_only_the_router_prometheus_and_grafana_are_published_and_on_loopback_only() -> None:
    published = {n: s["ports"] for n, s in SERVICES.items() if s.get("ports")}
    assert set(published) == {"router", "prometheus", "grafana"}
    assert all(str(p).startswith("127.0.0.1:") for ports in published.values() for p in ports)


def test_secrets_are_made_up_once_kept_and_given_ones_win(tmp_path: Path) -> None:
    module = init_secrets()
    module.write(tmp_path, {})
    first = {name: (tmp_path / name).read_text() for name in module.FILES}
    assert all((tmp_path / name).stat().st_mode & 0o777 == 0o444 for name in module.FILES)
    assert len(first["cluster/cluster_secret"]) == 64 and first["router/api_key"] == ""
    assert first["cluster/redis_password"] == first["redis/password"]
    module.write(tmp_path, {})  # a later `docker compose up`: the same secrets
    assert {name: (tmp_path / name).read_text() for name in module.FILES} == first
    module.write(tmp_path, {"KVSERVE_CLUSTER_SECRET": "g" * 40, "KVSERVE_REDIS_PASSWORD": "pw"})
    assert (tmp_path / "cluster/cluster_secret").read_text() == "g" * 40
    for holder in ("worker", "router"):
        given = (tmp_path / f"{holder}/cluster_secret").read_text()
        assert given == grant("g" * 40, holder)
        assert (tmp_path / f"{holder}/redis_username").read_text() == holder
        assert (tmp_path / f"{holder}/redis_password").read_text() == role_password("pw", holder)
    conf = (tmp_path / "redis/redis.conf").read_text()
    assert conf.startswith('requirepass "pw"\n') and conf.count('"pw"') == 1
    assert f'masteruser {REPLICA}\nmasterauth "{role_password("pw", REPLICA)}"\n' in conf
    assert (tmp_path / "grafana/admin_password").read_text() == first["grafana/admin_password"]
    module.write(tmp_path, {"KVSERVE_GRAFANA_PASSWORD": "gp"})
    assert (tmp_path / "grafana/admin_password").read_text() == "gp"
    assert json.loads((tmp_path / "exporter/passwords.json").read_text()) == {
        environment(SERVICES["redis-exporter"])["REDIS_ADDR"]: role_password("pw", EXPORTER)
    }
    bad = subprocess.run(
        [sys.executable, str(INIT), str(tmp_path)],
        env={"KVSERVE_CLUSTER_SECRET": "short", "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert bad.returncode == 2 and "cluster_secret" in bad.stderr


def test_each_secret_is_mounted_only_where_it_is_read(secrets_roots: dict[str, Path]) -> None:
    """Redis (primary and replica) starts with its file of users (the administrator's
    requirepass, each role's user, the replication user) and checks health with the
    administrator's password, the Sentinels with their template; redis_exporter reads its
    own user's password by its file setting, Prometheus its key; workers get a worker's
    grant and the ``worker`` Redis user, the router a router's grant, the ``router`` user
    and the API keys, through deploy/with-secrets.sh; no service mounts the volume that holds
    the secret itself, and no other service mounts any secrets volume."""
    root = secrets_roots["base"]
    redis = SERVICES["redis"]
    conf = secret_file(redis, redis["command"][1], root)
    password = secret_file(redis, f"{SECRETS_DIR}/redis/password", root)
    assert conf.startswith(f'requirepass "{password}"\n') and "user worker on " in conf
    assert "/run/kvserve/redis/password" in str(redis["healthcheck"]["test"])
    replica = SERVICES["redis-replica"]
    assert secret_file(replica, replica["command"][1], root) == conf
    sentinel = secret_file(SERVICES["sentinel-1"], f"{SECRETS_DIR}/redis/sentinel.conf", root)
    assert f'sentinel auth-pass kvserve "{role_password(password, SENTINEL)}"' in sentinel
    assert f"sentinel auth-user kvserve {SENTINEL}" in sentinel
    assert f'requirepass "{password}"' in sentinel
    exporter = SERVICES["redis-exporter"]
    passwords = secret_file(exporter, environment(exporter)["REDIS_PASSWORD_FILE"], root)
    assert role_password(password, EXPORTER) in passwords and password not in passwords
    assert environment(exporter)["REDIS_USER"] == EXPORTER
    readers: dict[str, set[str]] = {}
    for name, service in SERVICES.items():
        for target, (volume, _) in mounts(service).items():
            if target.startswith(SECRETS_DIR) and name not in ONE_SHOT:
                readers.setdefault(volume, set()).add(name)
    assert readers == {
        "secrets-worker": {"prefill", "decode"},
        "secrets-router": {"router"},
        "secrets-redis": {"redis", "redis-replica", "sentinel-1", "sentinel-2", "sentinel-3"},
        "secrets-exporter": {"redis-exporter"},
        "secrets-prometheus": {"prometheus"},
        "secrets-grafana": {"grafana"},
    }
    grafana = SERVICES["grafana"]
    assert secret_file(grafana, environment(grafana)["GF_SECURITY_ADMIN_PASSWORD__FILE"], root)
    web = prometheus_login(root)
    assert web["user"] == "kvserve" and bcrypt.checkpw(web["password"], web["hash"])
    assert base64.b64decode(web["health"]) == b"kvserve:" + web["password"]
    for name in ("prefill", "decode", "router"):
        exported = secret_env(SERVICES[name], root)
        holder = "router" if name == "router" else "worker"
        assert exported["KVSERVE_REDIS_USERNAME"] == holder
        assert exported["KVSERVE_REDIS_PASSWORD"] == role_password(password, holder)
        secret = (root / "cluster/cluster_secret").read_text()
        assert exported["KVSERVE_CLUSTER_SECRET"] == grant(secret, holder)
        assert ("KVSERVE_API_KEY" in exported) == (name == "router")
    assert parse_api_keys(secret_env(SERVICES["router"], root)["KVSERVE_API_KEY"]).enabled


@pytest.mark.parametrize("name", ["prefill", "router"])
def test_the_real_wrapper_exports_what_the_service_mounts(
    name: str, secrets_roots: dict[str, Path], tmp_path: Path
) -> None:
    """deploy/with-secrets.sh run by sh over only the directories ``name`` mounts exports
    exactly what :func:`secret_env` says (the simulation the other tests rely on)."""
    root, service = secrets_roots["base"], SERVICES[name]
    for target in mounts(service):
        if target.startswith(SECRETS_DIR + "/"):
            own = target.removeprefix(SECRETS_DIR + "/")
            shutil.copytree(root / own, tmp_path / own)
    script = [sys.executable, "-c", "import json, os; print(json.dumps(dict(os.environ)))"]
    done = subprocess.run(
        ["sh", str(ROOT / "deploy/with-secrets.sh"), *script],
        env={"KVSERVE_SECRETS_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    exported = {k: v for k, v in json.loads(done.stdout).items() if k.startswith("KVSERVE_")}
    exported.pop("KVSERVE_SECRETS_DIR")
    assert exported == secret_env(service, root) and exported["KVSERVE_CLUSTER_SECRET"]


def test_the_redis_users_name_the_keys_of_the_cluster_compose_runs() -> None:
    """redis.conf's users may use only the keys of ``init_secrets.CLUSTER``: it must be the
    cluster every service of the compose file joins, or each would be refused its keys."""
    joined = {environment(SERVICES[n])["KVSERVE_CLUSTER"] for n in ("prefill", "decode", "router")}
    assert joined == {init_secrets().CLUSTER}

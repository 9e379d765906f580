"""The compose cluster's secrets, written before any other service starts (the one-shot
``secrets`` service of docker-compose.yml runs ``python deploy/init_secrets.py ROOT``).

Under ``ROOT`` (default ``/run/kvserve``) there is one directory per group of readers, each
a named volume that only those services mount, read-only (:data:`FILES`):

- ``cluster/``: ``cluster_secret`` and ``redis_password`` themselves, read by this service
  alone (so that a later run keeps them);
- ``worker/``: ``cluster_secret`` holding a worker's grant (:mod:`proto.grants`: what a
  worker needs of the secret, never the secret), ``redis_username`` and ``redis_password``:
  the ``worker`` Redis user and its password (:mod:`kvserve.cluster.redis_acl`: derived
  from the Redis password, allowed only what a worker does), for the workers
  (``deploy/with-secrets.sh`` exports them as ``KVSERVE_CLUSTER_SECRET``,
  ``KVSERVE_REDIS_USERNAME`` and ``KVSERVE_REDIS_PASSWORD``, also for their health checks);
- ``router/``: the same with a router's grant and the ``router`` Redis user, and
  ``api_key``: the router's API keys (``KVSERVE_API_KEY``): the ones given, plus a key of
  tenant ``prometheus`` for the scrape of ``/metrics``; empty (no keys, the router open)
  when none are given;
- ``redis/``: ``redis.conf`` (its ``requirepass``, every role's user, and the ``masteruser``
  it replicates as: the primary and the replica are started with it), ``sentinel.conf`` (the
  three Sentinels' template: they watch ``redis``, answer the administrator and the roles,
  and each copies it to a file of its own, which Sentinel rewrites) and ``password`` (the
  administrator's, for health checks);
- ``exporter/passwords.json``: redis_exporter's ``REDIS_PASSWORD_FILE``: the ``exporter``
  user's password (docker-compose.yml names the user, ``REDIS_USER``);
- ``prometheus/router_key``: the bearer token of Prometheus's scrape of the router;
  ``web.yml``: its ``--web.config.file``, every request signed in with basic auth as
  :data:`PROMETHEUS_USER` (a bcrypt hash of the reader password); ``health_auth``: that
  login as a ``Basic`` credential, for its health check;
- ``grafana/admin_password``: Grafana's admin password (``GF_SECURITY_ADMIN_PASSWORD__FILE``);
  ``prometheus_password``: the reader password Grafana's data source signs in to Prometheus
  with (also yours: ``docker compose exec grafana cat /run/kvserve/grafana/prometheus_password``).

The cluster secret and the Redis password are the ones given in this service's environment
(``KVSERVE_CLUSTER_SECRET``, ``KVSERVE_REDIS_PASSWORD``), else the ones written by an
earlier run (so a service recreated later still agrees with the others), else new ones
(:func:`proto.trust.new_secret`, :func:`kvserve.cluster.redis.new_password`); Grafana's
password likewise (``KVSERVE_GRAFANA_PASSWORD``), and Prometheus's reader password
(``KVSERVE_PROMETHEUS_PASSWORD``); the Prometheus key likewise, never
given. Every file is replaced atomically, mode 0444 (the readers run as different users;
each volume is mounted only where it is read). Invalid
input (a short secret, a malformed key list) exits non-zero, naming the setting, and then
no other service starts.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

import bcrypt

from kvserve.cluster.redis import RedisConfig, new_password
from kvserve.cluster.redis_acl import EXPORTER, ROUTER, WORKER, role_password
from kvserve.cluster.redis_ha import node_auth_conf, sentinel_conf
from proto.grants import grant
from proto.trust import check_secret, new_secret
from router.api.auth import parse_api_keys

CLUSTER = "kvserve"
"""The cluster's name (``KVSERVE_CLUSTER`` in docker-compose.yml): its Redis users may use
only its keys."""
REDIS_ADDR = "redis://redis:6379"
"""Where redis_exporter scrapes (its ``REDIS_ADDR`` in docker-compose.yml)."""
PROMETHEUS_TENANT = "prometheus"
PROMETHEUS_USER = "kvserve"
"""Who may read Prometheus (basic auth; deploy/grafana's data source signs in as it)."""
BCRYPT_ROUNDS = 10
SENTINEL_PORT = 26379
"""Where each Sentinel listens (its container's; KVSERVE_REDIS_URL in docker-compose.yml)."""
FILES = (
    "cluster/cluster_secret",
    "cluster/redis_password",
    "worker/cluster_secret",
    "worker/redis_username",
    "worker/redis_password",
    "router/cluster_secret",
    "router/redis_username",
    "router/redis_password",
    "router/api_key",
    "redis/redis.conf",
    "redis/sentinel.conf",
    "redis/password",
    "exporter/passwords.json",
    "prometheus/router_key",
    "prometheus/web.yml",
    "prometheus/health_auth",
    "grafana/admin_password",
    "grafana/prometheus_password",
)
"""Every file written, relative to the root (tests/unit/test_compose.py checks that each
is where its reader looks)."""


def _kept(root: Path, name: str, given: str, new: str) -> str:
    """``given``, else what ``root/name`` holds, else ``new``."""
    path = root / name
    if given:
        return given
    if path.is_file() and path.read_text():
        return path.read_text()
    return new


def web_config(path: Path, password: str) -> str:
    """Prometheus's web configuration (``--web.config.file``, YAML written as JSON): basic
    auth, one user, :data:`PROMETHEUS_USER`, whose bcrypt hash is ``password``'s: the one in
    ``path`` if it still matches (so a later run writes the same file), else a new one."""
    try:
        hashed = str(json.loads(path.read_text())["basic_auth_users"][PROMETHEUS_USER])
        if bcrypt.checkpw(password.encode(), hashed.encode()):
            return path.read_text()
    except (OSError, ValueError, KeyError, TypeError):
        pass  # none yet, or not one of ours: a new one
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(BCRYPT_ROUNDS)).decode()
    return json.dumps({"basic_auth_users": {PROMETHEUS_USER: hashed}}) + "\n"


def contents(root: Path, environ: Mapping[str, str]) -> dict[str, str]:
    """What each of :data:`FILES` is to hold (module docstring); ValueError on bad input."""
    secret = _kept(root, FILES[0], environ.get("KVSERVE_CLUSTER_SECRET", ""), new_secret())
    password = _kept(root, FILES[1], environ.get("KVSERVE_REDIS_PASSWORD", ""), new_password())
    prometheus = _kept(root, "prometheus/router_key", "", new_password())
    grafana = environ.get("KVSERVE_GRAFANA_PASSWORD", "")
    grafana = _kept(root, "grafana/admin_password", grafana, new_password())
    given = environ.get("KVSERVE_PROMETHEUS_PASSWORD", "")
    reader = _kept(root, "grafana/prometheus_password", given, new_password())
    check_secret(secret)
    redis = RedisConfig(password=password, cluster=CLUSTER)  # raises on line breaks and NUL
    keys = environ.get("KVSERVE_API_KEY", "").strip()
    router_keys = f"{keys},{PROMETHEUS_TENANT}={prometheus}" if keys else ""
    parse_api_keys(router_keys)  # raises, naming the entry's position only
    texts = (
        secret,
        password,
        grant(secret, WORKER),
        WORKER,
        role_password(password, WORKER),
        grant(secret, ROUTER),
        ROUTER,
        role_password(password, ROUTER),
        router_keys,
        node_auth_conf(redis),
        sentinel_conf(dataclasses.replace(redis, host="redis"), SENTINEL_PORT, "0.0.0.0", True),
        password,
        json.dumps({REDIS_ADDR: role_password(password, EXPORTER)}),
        prometheus,
        web_config(root / "prometheus/web.yml", reader),
        base64.b64encode(f"{PROMETHEUS_USER}:{reader}".encode()).decode(),
        grafana,
        reader,
    )
    return dict(zip(FILES, texts, strict=True))


def write(root: Path, environ: Mapping[str, str]) -> None:
    """Write every file under ``root`` (each replaced atomically, mode 0444)."""
    for name, text in contents(root, environ).items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.unlink(missing_ok=True)
        tmp.write_text(text)
        tmp.chmod(0o444)
        tmp.replace(path)


def main(argv: list[str]) -> int:
    root = Path(argv[1] if len(argv) > 1 else "/run/kvserve")
    try:
        write(root, os.environ)
    except ValueError as exc:
        print(f"init_secrets: error: {exc}", file=sys.stderr)
        return 2
    print(f"init_secrets: wrote {len(FILES)} files under {root}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""The Redis users of a cluster: one per role, each allowed only the commands, and only on
the keys, that its role's code uses (docs/security.md, "Redis").

Which user does what (``<c>`` is the cluster name; key names from :mod:`proto.record_store`,
:mod:`proto.kv_stream`, :mod:`router.control.lease` and :mod:`kvpool.chain_index`):

- ``router``: reads the worker records (``SCAN``, ``MGET``) and the KV-event stream
  (``XREAD``, ``XREVRANGE``), asks a worker for a snapshot (``SET <c>:kv-events:want:*``), holds the
  controller lease (``<c>:controller``, its scripts) and reads the chain index's counts;
- ``worker``: writes and removes worker records and the contract, appends to the KV-event
  stream (``XADD``), takes its snapshot requests (``DEL``) and runs the chain index's
  scripts on ``{<c>:pool}:*``;
- ``exporter`` (compose's redis_exporter): server statistics only (``INFO``, ``SLOWLOG``,
  ``LATENCY``...), no key, no ``CONFIG``;
- with Redis HA, on the data nodes ``replica`` (replication only) and ``sentinel`` (what a
  Sentinel sends to fail over, ``CONFIG REWRITE`` its one ``CONFIG`` subcommand); on the
  Sentinels the ``sentinel`` user (the Sentinels among themselves), and ``router`` and
  ``worker`` may only ask where the primary is.

No role gets ``FLUSHALL``, ``FLUSHDB``, ``KEYS``, ``CONFIG SET``, ``ACL``, ``DEBUG``,
``SHUTDOWN`` or any key of another role. The configured user (or ``default``) keeps every
command: it is the launcher's and the operator's, handed to no cluster process.

Passwords: one password is configured (``redis_password``); each role's is derived from it
(:func:`role_password`, an HMAC), so whoever holds the configured password can make every
role's, and a process holding one role's learns nothing of the others'. A Redis without a
password (loopback only, see :class:`kvserve.cluster.redis.RedisConfig`) has no users:
every process is then ``default``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import re

from proto.registry import ClusterConfig
from proto.trust import b64url

ROUTER, WORKER, EXPORTER = "router", "worker", "exporter"
REPLICA, SENTINEL = "replica", "sentinel"
ROLES = (ROUTER, WORKER, EXPORTER, REPLICA, SENTINEL)
"""Every user this module defines; none may be the configured (administrator's) user."""
CLUSTER_NAME = re.compile(r"[A-Za-z0-9_.:-]+")
"""A cluster name that is safe in a key pattern and a config line as it is."""

_HOME = "resetchannels -@all +ping"
"""Where each role's rules start: no command, no key, no channel, but PING."""


def conf_quoted(text: str) -> str:
    """A redis.conf argument that keeps every character (double quotes, escapes)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def role_password(password: str, role: str) -> str:
    """Role ``role``'s password, derived from the configured ``password`` (256 bits)."""
    tag = hmac.new(password.encode(), f"kvserve/redis-role/v1/{role}".encode(), hashlib.sha256)
    return b64url(tag.digest())


def check_cluster_name(cluster: str) -> None:
    """ValueError unless ``cluster`` can name keys in an ACL rule (:data:`CLUSTER_NAME`)."""
    if not CLUSTER_NAME.fullmatch(cluster):
        raise ValueError(
            f"a cluster name is letters, digits and _.:-, got {cluster!r} (it names the keys "
            f"each Redis user may use)"
        )


def rules(role: str, cluster: str) -> str:
    """The ACL rules of ``role`` on a data node of cluster ``cluster`` (module docstring);
    Redis 7 selectors, ``(...)``, pair each key pattern with its commands."""
    check_cluster_name(cluster)
    c = cluster
    pool = f"{{{c}:pool}}:*"
    table = {
        ROUTER: [
            f"{_HOME} +role +scan",
            f"(%R~{c}:worker:* +mget +get)",
            f"(~{c}:controller +set +get +pexpire +del +evalsha +eval +script|load)",
            f"(%R~{c}:kv-events +xread +xrevrange)",
            f"(%W~{c}:kv-events:want:* +set)",
            f"(%R~{pool} +zcard +get +hgetall)",
        ],
        WORKER: [
            f"{_HOME} +role",
            f"(~{c}:worker:* +set +del)",
            f"(~{c}:contract +set +get +pexpire)",
            f"(%W~{c}:kv-events +xadd)",
            f"(~{c}:kv-events:want:* +del)",
            f"(~{pool} +evalsha +eval +script|load +time +get +hget +hgetall +hset +hdel "
            f"+hincrby +incrby +decrby +zadd +zrem +zscore +zrange +zcard +zremrangebyscore)",
        ],
        EXPORTER: [
            f"{_HOME} +info +role +dbsize +select +slowlog|get +slowlog|len +latency|latest "
            f"+latency|histogram +client|list +memory|stats"
        ],
        REPLICA: [f"{_HOME} +psync +replconf"],
        SENTINEL: [
            "allchannels -@all +ping +info +role +multi +exec +slaveof +replicaof "
            "+config|rewrite +client|setname +client|kill +script|kill +subscribe +publish"
        ],
    }
    return " ".join(table[role])


SENTINEL_ASKS = (
    f"{_HOME} +sentinel|masters +sentinel|master +sentinel|get-master-addr-by-name "
    "+sentinel|sentinels +sentinel|replicas +sentinel|slaves"
)
"""What ``router`` and ``worker`` may ask a Sentinel: where the primary is."""


def user_line(role: str, password: str, role_rules: str) -> str:
    """The ``user`` line of ``role`` under ``password`` (the configured one)."""
    secret = conf_quoted(">" + role_password(password, role))
    return f"user {role} on {secret} {role_rules}\n"


def node_users(password: str, cluster: str, ha: bool) -> str:
    """Every role's ``user`` line on a data node ('' without a password); ``ha``: with the
    users of replication and the Sentinels."""
    if not password:
        return ""
    roles = ROLES if ha else (ROUTER, WORKER, EXPORTER)
    return "".join(user_line(role, password, rules(role, cluster)) for role in roles)


def sentinel_users(password: str) -> str:
    """The ``user`` lines on a Sentinel: its peers', and the clients' who ask for the
    primary ('' without a password)."""
    if not password:
        return ""
    lines = [user_line(SENTINEL, password, "~* &* +@all")]
    lines += [user_line(role, password, SENTINEL_ASKS) for role in (ROUTER, WORKER)]
    return "".join(lines)


def as_role(cluster: ClusterConfig, role: str) -> ClusterConfig:
    """``cluster`` with role ``role``'s Redis credentials in place of the configured ones
    (unchanged without a password: there are no users then)."""
    if not cluster.redis_password:
        return cluster
    secret = role_password(cluster.redis_password, role)
    return dataclasses.replace(cluster, redis_username=role, redis_password=secret)

"""A process that is broken into holds only its role's Redis login (kvserve/cluster/redis_acl.py),
on the cluster this folder shares (``eval_cluster``: the real router, a prefill and a decode
worker, Redis and mooncake_master, started as ``kvserve up`` starts them).

First the cluster serves completions (a repeated prompt, streamed and not) and Redis's ACL log
must stay empty: no role was refused anything its code does. Then the test plays a broken-into
worker, then a broken-into router, with the Redis user name and
password the launcher handed that process (its command line and its environment): neither
can read Redis's configuration, list or rewrite its users, wipe it, or write what the other
role writes. The cluster keeps serving completions meanwhile, and its registry is intact.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import redis

from kvserve.cluster.launch import Cluster
from proto.registry import connect, list_workers
from tests.redis_logins import refused
from tests.tiny_cluster import MODEL_NAME, cluster_client, prompt_of

ATTEMPTS: tuple[tuple[Any, ...], ...] = (
    ("CONFIG", "GET", "requirepass"),  # the administrator's password
    ("ACL", "LIST"),
    ("ACL", "SETUSER", "mine", "on", ">x", "~*", "+@all"),
    ("KEYS", "*"),
    ("FLUSHALL",),
)
"""In this order: on a login that may do everything, the harmless reads fail the test
before ``FLUSHALL`` could wipe the shared cluster."""


def login_of(cluster: Cluster, name: str) -> redis.Redis:
    """A Redis client with the credentials process ``name`` was started with."""
    plan = cluster.plan_of(name)
    argv, env = list(plan.argv), dict(plan.env)
    user = argv[argv.index("--redis-username") + 1] if "--redis-username" in argv else ""
    config = dataclasses.replace(
        cluster.cluster_config,
        redis_username=user,
        redis_password=env["KVSERVE_REDIS_PASSWORD"],
    )
    return connect(config, socket_timeout=10, socket_connect_timeout=10)


@pytest.mark.timeout(300)
def test_a_broken_into_process_holds_only_its_roles_redis_login(eval_cluster: Cluster) -> None:
    cluster = eval_cluster
    name = cluster.cluster_config.cluster
    decode = next(n for n in cluster.worker_names if cluster.plan_of(n).role == "decode")
    other = [("SET", f"{name}:controller", "me"), ("XREAD", "STREAMS", f"{name}:kv-events", "0")]
    forged = ("SET", f"{name}:worker:{decode}", "forged")  # the router reads records only
    admin = connect(cluster.cluster_config, socket_timeout=10)
    try:
        served(cluster)
        assert admin.acl_log() == []  # every command the processes sent was allowed
        before = sorted(r.worker_id for r in list_workers(admin, cluster.cluster_config.keys))
        for process, own in ((decode, other), ("router", [forged])):
            client = login_of(cluster, process)
            try:
                assert client.ping()
                for command in (*ATTEMPTS, *own):  # stops at the first one allowed
                    assert refused(client, command), f"{process}'s login may run {command[:2]}"
            finally:
                client.close()
        after = sorted(r.worker_id for r in list_workers(admin, cluster.cluster_config.keys))
        assert after == before == sorted(cluster.worker_names)
    finally:
        admin.close()
    served(cluster)


def served(cluster: Cluster) -> None:
    """A few completions through the router: a long prompt twice (a prefix hit the second
    time), streamed once."""
    client = cluster_client(cluster)
    prompt = prompt_of(160, 4242)
    done = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=4)
    assert done.choices[0].text
    chunks = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=4, stream=True)
    assert "".join(c.choices[0].text for c in chunks)

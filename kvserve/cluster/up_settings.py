"""The settings of ``kvserve up`` (:class:`UpConfig`, the router's placement settings and
API keys, and the engine, pool, master and transport settings every process of the cluster
shares) and the
:class:`ClusterSpec` they describe (:func:`spec_from_args`)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from kvpool.config import PoolConfig
from kvpool.master import MasterConfig
from kvserve.cluster.deployment import SEGMENT_MIB
from kvserve.cluster.netns import DEFAULT_SUBNET, DEFAULT_TAG
from kvserve.cluster.pool_ha import ha_ports_needed
from kvserve.cluster.spec import ClusterSpec, new_cluster_config
from kvserve.settings import add_config_args, config_from_args
from proto.registry import ClusterConfig
from router.config import RouterConfig
from workers.config import EngineConfig, VllmOptions, WorkerConfig

ROUTER_SETTINGS = ("policy", "disagg_threshold_tokens", "api_key")
"""The router's settings ``kvserve up`` takes (:class:`RouterConfig`'s own flags and variables)."""
TRANSPORT_SETTINGS = (
    *("cluster", "redis_username", "redis_password", "peer_timeout_s"),
    *("grpc_tls_cert", "grpc_tls_key", "grpc_tls_ca"),
    *("cluster_secret", "hash_algorithm"),
)
"""The :class:`ClusterConfig` settings of ``kvserve up`` (the rest is the cluster's own)."""
MADE_UP_WHEN_EMPTY = ("redis_password", "cluster_secret")
"""Settings that, left empty, :func:`new_cluster_config` makes up for the run."""


@dataclass(frozen=True)
class UpConfig:
    """The cluster shape of ``kvserve up``.

    - ``prefill``: prefill workers;
    - ``decode``: decode workers;
    - ``mixed``: colocated prefill+decode workers;
    - ``host``: address the router (nginx, with several) binds to; every other process
      stays on loopback;
    - ``router_port``: the router's HTTP port (the clients' port: with several routers,
      nginx's in front of them);
    - ``routers``: how many routers; more than one run on the ports after ``router_port``
      behind nginx on ``router_port`` (round-robin; a router that dies is left out, and
      restarted by ``kvserve up``); the P:D controller acts from one of them at a time;
    - ``worker_base_port``: the first worker's gRPC port (the others count up from it);
    - ``worker_metrics_base_port``: the first worker's Prometheus ``/metrics`` port (the
      others count up from it; 0: none);
    - ``redis_port``: the registry's port;
    - ``redis_ha``: run the registry as a primary, a replica and three Sentinels (on
      ``redis_port`` and the four ports after it); every client finds the primary through
      the Sentinels and follows a failover (kvserve/cluster/redis_ha.py);
    - ``pool_masters``: pool masters; 2 or more run Mooncake's HA mode: they elect a leader
      through three etcd members, which with the further masters listen on the ports from
      ``master_port`` + 100 up (kvserve/cluster/pool_ha.py); members follow the leader;
    - ``free_ports``: use free loopback ports for every process;
    - ``log_dir``: one log file per process (default: a temp dir);
    - ``pin_cores``: give each worker its own CPU cores when there are enough;
    - ``use_pool``: run mooncake_master and join the KV pool (--no-use-pool: mixed workers
      only);
    - ``hosts``: run every process on its own network host: a network namespace with its
      own address on a private bridge (Linux, as root; see kvserve/cluster/netns.py);
    - ``hosts_subnet``: addresses for --hosts (an IPv4 subnet);
    - ``hosts_tag``: prefix of the namespaces and links of --hosts;
    - ``hosts_user``: with --hosts, run every process as this user (name or uid; never
      root), or each role as its own (``router=A,worker=B,service=C``); default: the user
      who ran sudo, else an account made up for each role
      (:func:`kvserve.cluster.runas.accounts`);
    - ``startup_timeout_s``: seconds to wait for every process to be healthy;
    - ``ask``: once healthy, send this chat message through the router and print the
      answer;
    - ``exit_after_ask``: stop the cluster after --ask answered.
    """

    env_prefix: ClassVar[str] = "KVSERVE_UP_"
    prefill: int = ClusterSpec.prefill
    decode: int = ClusterSpec.decode
    mixed: int = ClusterSpec.mixed
    host: str = ClusterSpec.host
    router_port: int = ClusterSpec.router_port
    routers: int = 1
    worker_base_port: int = ClusterSpec.worker_base_port
    worker_metrics_base_port: int = 9100
    redis_port: int = ClusterSpec.redis_port
    redis_ha: bool = False
    pool_masters: int = ClusterSpec.pool_masters
    free_ports: bool = False
    log_dir: str = ""
    pin_cores: bool = ClusterSpec.pin_cores
    use_pool: bool = ClusterSpec.use_pool
    hosts: bool = False
    hosts_subnet: str = DEFAULT_SUBNET
    hosts_tag: str = DEFAULT_TAG
    hosts_user: str = ""
    startup_timeout_s: float = ClusterSpec.startup_timeout_s
    ask: str = ""
    exit_after_ask: bool = False

    def __post_init__(self) -> None:
        if self.routers < 1:
            raise ValueError(f"routers must be >= 1, got {self.routers}")
        if self.pool_masters < 1:
            raise ValueError(f"pool_masters must be >= 1, got {self.pool_masters}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Every flag of ``kvserve up``, one group per settings class (the secrets: prefer
    KVSERVE_CLUSTER_SECRET, KVSERVE_REDIS_PASSWORD and KVSERVE_API_KEY to the flags; the
    first two are made up when empty)."""
    add_config_args(parser, UpConfig)
    add_config_args(parser, RouterConfig, only=ROUTER_SETTINGS)
    add_config_args(parser, ClusterConfig, only=TRANSPORT_SETTINGS)
    add_config_args(parser, EngineConfig)
    add_config_args(parser, WorkerConfig, only=("engine",))
    add_config_args(parser, VllmOptions)
    add_config_args(parser, PoolConfig, defaults={"pool_segment_mib": SEGMENT_MIB})
    add_config_args(parser, MasterConfig)


def spec_from_args(args: argparse.Namespace) -> ClusterSpec:
    """The :class:`ClusterSpec` the flags describe (``--pool-master`` etc. are replaced by
    the cluster's own master; the settings of :data:`MADE_UP_WHEN_EMPTY` are made up when
    empty)."""
    up = config_from_args(UpConfig, args)
    master = config_from_args(MasterConfig, args)
    ha = ha_ports_needed(up.pool_masters) if up.pool_masters > 1 else 0
    transport = {name: getattr(args, name) for name in TRANSPORT_SETTINGS}
    transport = {k: v for k, v in transport.items() if v or k not in MADE_UP_WHEN_EMPTY}
    spec = ClusterSpec(
        prefill=up.prefill,
        decode=up.decode,
        mixed=up.mixed,
        host=up.host,
        router_port=up.router_port,
        router_ports=tuple(up.router_port + i for i in range(1, up.routers + 1))
        if up.routers > 1
        else (),
        worker_base_port=up.worker_base_port,
        worker_metrics_base_port=up.worker_metrics_base_port,
        redis_port=up.redis_port,
        redis_ha_ports=tuple(up.redis_port + i for i in range(1, 5)) if up.redis_ha else (),
        master=master,
        pool_masters=up.pool_masters,
        pool_ha_ports=tuple(range(master.master_port + 100, master.master_port + 100 + ha))
        if up.pool_masters > 1
        else (),
        use_pool=up.use_pool,
        engine=config_from_args(EngineConfig, args),
        worker_engine=args.engine,
        vllm=config_from_args(VllmOptions, args),
        pool=config_from_args(PoolConfig, args),
        cluster=new_cluster_config(**transport),
        api_key=args.api_key,
        policy=args.policy,
        disagg_threshold_tokens=args.disagg_threshold_tokens,
        pin_cores=up.pin_cores,
        log_dir=Path(up.log_dir) if up.log_dir else None,
        startup_timeout_s=up.startup_timeout_s,
    )
    return spec.with_free_ports() if up.free_ports else spec

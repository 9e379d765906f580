"""The pool's master without a single point of failure: ``mooncake_master`` in Mooncake's
HA mode, several of them electing a leader through an etcd cluster of three members
(Debian's ``etcd-server``, installed by ``scripts/setup.sh``). The Redis backend of the HA
mode is refused by the installed wheel (0.3.13: ``--ha_backend_type=redis`` fails with
UNAVAILABLE_IN_CURRENT_MODE), so etcd it is.

- Pool members address the masters as ``etcd://HOST:PORT;...`` (:attr:`PoolHA.address`)
  and follow the leader after a failover; they exchange their segments' descriptions
  directly (``P2PHANDSHAKE``): no metadata server runs.
- The leader writes its RPC address under :data:`VIEW_KEY` in etcd; :func:`leader` reads it
  through etcd's JSON gateway. A standby takes over once the dead leader's etcd lease runs
  out, then warms up (about 10 s in all, observed here).
- Every master's metrics page is listed (:attr:`PoolHA.metrics_urls`): readers take the
  leader's, the only one that reports capacity (:func:`kvpool.master.master_stats_at`).

Process names: ``etcd-0`` .. ``etcd-2``, ``mooncake_master`` (the first master, as with one)
and ``mooncake_master-1`` ..; all in :class:`~kvserve.cluster.pool.PoolProcesses`, which
starts them in this order and waits for a leader (:func:`wait_leader`).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kvpool.config import ETCD_SCHEME
from kvpool.master import MasterConfig
from kvserve.cluster.pool import MASTER, PoolService, pool_services
from kvserve.cluster.processes import debian_binary

ETCD_MEMBERS = 3
"""etcd members: a quorum of two survives one member's death."""
VIEW_KEY = "mooncake-store/mooncake_cluster/master_view"
"""Where the leading master writes its RPC address (Mooncake's default cluster id)."""


def ha_ports_needed(masters: int) -> int:
    """Ports :class:`PoolHA` takes beyond the first master's: a client and a peer port per
    etcd member, an RPC and a metrics port per further master."""
    return 2 * ETCD_MEMBERS + 2 * (masters - 1)


def master_names(masters: int) -> list[str]:
    return [MASTER, *(f"{MASTER}-{i}" for i in range(1, masters))]


@dataclass(frozen=True)
class PoolHA:
    """Where the etcd members and the masters listen, all on ``host``."""

    host: str
    etcd: tuple[tuple[int, int], ...]
    """``(client, peer)`` port of each etcd member."""
    masters: tuple[tuple[int, int], ...]
    """``(rpc, metrics)`` port of each master, the first one's from its MasterConfig."""

    @classmethod
    def of(cls, cfg: MasterConfig, masters: int, ports: Sequence[int]) -> PoolHA:
        """The layout of ``ports`` (:func:`ha_ports_needed` of them) for ``masters``."""
        if masters < 2 or len(ports) != ha_ports_needed(masters):
            raise ValueError(f"{masters} HA masters need {ha_ports_needed(masters)} ports")
        pairs = ports[: 2 * ETCD_MEMBERS]
        etcd = tuple(zip(pairs[0::2], pairs[1::2], strict=True))
        rest = ports[2 * ETCD_MEMBERS :]
        more = tuple(zip(rest[0::2], rest[1::2], strict=True))
        return cls(cfg.master_host, etcd, ((cfg.master_port, cfg.master_metrics_port), *more))

    @property
    def endpoints(self) -> str:
        """Every etcd member's client address, ``;``-separated (the masters' flag)."""
        return ";".join(f"{self.host}:{c}" for c, _ in self.etcd)

    @property
    def address(self) -> str:
        """The masters' address for pool members: ``etcd://`` and every etcd member."""
        return ETCD_SCHEME + self.endpoints

    @property
    def metrics_urls(self) -> str:
        return ",".join(f"http://{self.host}:{m}/metrics" for _, m in self.masters)

    def etcd_command(self, index: int, data_dir: Path) -> list[str]:
        client, peer = self.etcd[index]
        cluster = ",".join(f"etcd-{i}=http://{self.host}:{p}" for i, (_, p) in enumerate(self.etcd))
        return [
            debian_binary("etcd", "etcd-server"),
            f"--name=etcd-{index}",
            f"--data-dir={data_dir / f'etcd-{index}'}",
            f"--listen-client-urls=http://{self.host}:{client}",
            f"--advertise-client-urls=http://{self.host}:{client}",
            f"--listen-peer-urls=http://{self.host}:{peer}",
            f"--initial-advertise-peer-urls=http://{self.host}:{peer}",
            f"--initial-cluster={cluster}",
            "--initial-cluster-state=new",
            "--logger=zap",
            "--log-level=warn",
        ]

    def master_config(self, cfg: MasterConfig, index: int) -> MasterConfig:
        """Master ``index``'s settings: ``cfg`` on its own ports, in HA mode over etcd."""
        rpc, metrics = self.masters[index]
        return dataclasses.replace(
            cfg, master_port=rpc, master_metrics_port=metrics, master_etcd_endpoints=self.endpoints
        )


def ha_services(cfg: MasterConfig, ha: PoolHA, data_dir: Path) -> tuple[PoolService, ...]:
    """The etcd members, then the masters, in start order (each master as
    :func:`~kvserve.cluster.pool.pool_services` runs one in HA mode, under its own name)."""
    etcd = tuple(
        PoolService(f"etcd-{i}", tuple(ha.etcd_command(i, data_dir)), ha.host, ports)
        for i, ports in enumerate(ha.etcd)
    )
    masters = tuple(
        dataclasses.replace(pool_services(ha.master_config(cfg, i))[0], name=name)
        for i, name in enumerate(master_names(len(ha.masters)))
    )
    return etcd + masters


def leader(ha: PoolHA, timeout: float = 1.0) -> str | None:
    """The name of the leading master (:data:`VIEW_KEY`), or None when there is none now
    (an election under way) or no etcd member answers."""
    body = json.dumps({"key": base64.b64encode(VIEW_KEY.encode()).decode()}).encode()
    for client, _ in ha.etcd:
        url = f"http://{ha.host}:{client}/v3/kv/range"
        request = urllib.request.Request(url, data=body, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as reply:
                kvs = json.load(reply).get("kvs", [])
        except (OSError, ValueError, urllib.error.URLError):
            continue
        if not kvs:
            return None
        address = base64.b64decode(kvs[0]["value"]).decode()
        ports = [rpc for rpc, _ in ha.masters]
        port = address.rpartition(":")[2]
        names = master_names(len(ha.masters))
        return next((n for n, p in zip(names, ports, strict=True) if str(p) == port), None)
    return None


def wait_leader(ha: PoolHA, timeout: float, other_than: str | None = None) -> str:
    """Wait until a master (not ``other_than``) leads; its name, or RuntimeError."""
    deadline = time.monotonic() + timeout
    while (name := leader(ha)) is None or name == other_than:
        if time.monotonic() > deadline:
            raise RuntimeError(f"no pool master took the lead within {timeout:g}s")
        time.sleep(0.2)
    return name

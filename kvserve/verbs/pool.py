"""``kvserve pool``: run a mooncake_master (the KV pool) for this machine."""

from __future__ import annotations

import argparse
import signal
import sys

from kvpool.master import MasterConfig
from kvserve.settings import config_from_args

SETTINGS = (MasterConfig,)


def run(args: argparse.Namespace) -> int:
    """Run mooncake_master and its metadata server until Ctrl-C or SIGTERM (exit 0), or
    until the master exits (its status)."""
    from kvserve.cluster.pool import MasterProcess

    cfg = config_from_args(MasterConfig, args)
    master = MasterProcess(cfg).start()
    stopped: list[bool] = []

    def stop(*_: object) -> None:
        stopped.append(True)
        master.terminate()

    signal.signal(signal.SIGTERM, stop)
    metadata = f"mooncake_http_metadata_server up: {cfg.metadata_url}"
    if cfg.master_etcd_endpoints:  # HA mode: no metadata server, the leader found in etcd
        metadata = f"in HA mode, electing its leader through etcd {cfg.master_etcd_endpoints}"
    print(
        f"kvserve pool: mooncake_master up: rpc {cfg.rpc_address}, metrics {cfg.metrics_url}; "
        f"{metadata} (Ctrl-C stops it)",
        file=sys.stderr,
        flush=True,
    )
    try:
        code = master.wait()
        return 0 if stopped else code
    except KeyboardInterrupt:
        return 0
    finally:
        master.stop()

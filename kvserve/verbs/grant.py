"""``kvserve grant <holder>``: print the grant cut from ``KVSERVE_CLUSTER_SECRET`` for a
worker, router or monitor (never a flag: a secret on a command line is visible to every
user of the machine; see docs/security.md)."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from kvserve.settings import env_name, setting
from proto.grants import SCOPES


@dataclass(frozen=True)
class GrantConfig:
    """Whose grant ``kvserve grant`` prints.

    - ``holder``: the role the grant is for.
    """

    holder: str = setting(positional=True, choices=tuple(sorted(SCOPES)))


SETTINGS = (GrantConfig,)


def run(args: argparse.Namespace) -> int:
    """Print ``args.holder``'s grant; ValueError when no cluster secret is set."""
    from proto.grants import grant

    secret = os.environ.get(env_name("cluster_secret"), "")
    if not secret:
        raise ValueError(f"set {env_name('cluster_secret')} to the cluster secret first")
    print(grant(secret, args.holder))
    return 0

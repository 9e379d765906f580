"""Least privilege: the grant each kind of process is given instead of the cluster secret.

``kvserve up`` (every launch path) and the compose ``secrets`` service keep the secret and
hand each process a grant (:meth:`proto.credentials.Credentials.grant`) of what its role
needs (:data:`SCOPES`):

- ``worker``: the prefix-root key (its chains), the pool-block key (it writes and checks
  blocks), the registry-record key (its record, the contract), the ``monitor`` token (its
  own health check) and the verifiers of the ``router`` and ``monitor`` tokens: a worker
  that is broken into cannot make the router's token, so it cannot steer the others
  (``SetRole``, ``Abort``, ``Reserve``);
- ``router``: the prefix-root key (pool lookups), the registry-record key (it checks
  records) and the ``router`` token. No pool-block key: it never writes or reads blocks,
  so it cannot forge one;
- ``monitor``: the ``monitor`` token only (probes, dashboards, tools that observe).

A process given the whole secret still works (a manual deployment); ``kvserve grant ROLE``
prints a grant from ``KVSERVE_CLUSTER_SECRET`` for deployments by hand.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from proto.credentials import Credentials
from proto.trust import MONITOR, POOL_BLOCK, PREFIX_ROOT, REGISTRY_RECORD, ROUTER, ROUTER_SIGN


@dataclass(frozen=True)
class Scope:
    """What one kind of process is granted: plane keys, tokens it presents, tokens it
    accepts."""

    keys: tuple[str, ...]
    tokens: tuple[str, ...]
    verifiers: tuple[str, ...]


SCOPES: Mapping[str, Scope] = {
    "worker": Scope((PREFIX_ROOT, POOL_BLOCK, REGISTRY_RECORD), (MONITOR,), (ROUTER, MONITOR)),
    "router": Scope((PREFIX_ROOT, REGISTRY_RECORD, ROUTER_SIGN), (), ()),
    "monitor": Scope((), (MONITOR,), ()),
}


def grant(setting: str, holder: str) -> str:
    """The ``cluster_secret`` value a ``holder`` process (a :data:`SCOPES` name) is given,
    cut from ``setting`` (the secret, or a grant that covers it); empty stays empty (a
    cluster without a secret). ValueError for an unknown holder."""
    if holder not in SCOPES:
        raise ValueError(f"unknown grant holder {holder!r}; use one of {sorted(SCOPES)}")
    credentials = Credentials.of(setting)
    if not credentials.secured:
        return ""
    scope = SCOPES[holder]
    return credentials.grant(scope.keys, scope.tokens, scope.verifiers)

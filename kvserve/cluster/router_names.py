"""The names of a cluster's routers and of the balancer in front of them. Pure.

One router (no ``router_ports``) is ``router`` and listens on ``router_port`` itself.
Several (``router_ports``, at least 2) are ``router-0``, ``router-1``, ... on those ports,
behind nginx (:data:`BALANCER`) on ``router_port``: clients use ``router_port`` either way.
Every router and the balancer run on the host named ``router`` (:data:`ROUTER`) unless a
host is given for that name itself.
"""

from __future__ import annotations

from collections.abc import Sequence

ROUTER = "router"
BALANCER = "balancer"


def router_names(ports: Sequence[int]) -> list[str]:
    """The routers' names, in port order (``router`` alone for no ports)."""
    return [f"{ROUTER}-{i}" for i in range(len(ports))] if ports else [ROUTER]


def is_router(name: str) -> bool:
    """Whether ``name`` is a router's (``router`` or ``router-<i>``)."""
    return name == ROUTER or (name.startswith(f"{ROUTER}-") and name[7:].isdigit())


def host_group(name: str) -> str:
    """The name whose host ``name`` runs on when none is given for it: ``router`` for a
    router or the balancer, else ``name`` itself."""
    return ROUTER if is_router(name) or name == BALANCER else name

"""Separate network hosts on one Linux machine: one network namespace per process, joined
by veth pairs to a private bridge, so that every connection between two processes crosses
a real network interface between two distinct addresses (``kvserve up --hosts`` and the
multi-host test). Needs root (CAP_NET_ADMIN) and ``ip`` from iproute2.

Lifecycle of :class:`NetHosts`:

1. ``NetHosts(names, subnet, tag)`` plans, purely: the bridge ``<tag>br`` takes the
   subnet's first address (this machine's own address on it: clients and health checks
   here reach every host through it); each name in order takes the next address, the
   namespace ``<tag>-<name>`` and a veth pair ``<tag>v<i>`` (bridge side) / ``eth0``
   (namespace side);
2. ``create()`` first removes leftovers of an earlier run with the same tag, then makes
   the bridge, the namespaces (loopback up) and the links, and brings all up; on any
   failure it removes what it made;
3. :meth:`hosts` gives each name its :class:`~kvserve.cluster.host.Host` (address, and the
   ``ip netns exec`` prefix that runs a command there, as the
   :class:`~kvserve.cluster.runas.RunAs` account when one is given: ``kvserve up --hosts``
   always gives one, so no process runs as root) for a
   :class:`~kvserve.cluster.spec.ClusterSpec`;
4. :meth:`link_down` / :meth:`link_up` pull and replug one host's cable (its bridge-side
   veth): packets to and from it are dropped, its sockets stay open;
5. ``destroy()`` (also on leaving ``with hosts.made():``) deletes the namespaces (their
   veths go with them) and the bridge; idempotent. Stop the processes first: a namespace
   with a process still in it lives on, unnamed, until that process exits.

The default subnet is 198.51.100.0/24 (TEST-NET-2, RFC 5737: never routed on the
internet); two runs at once need different tags and subnets.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import itertools
import logging
import os
import re
import shutil
import subprocess
from collections.abc import Iterator, Mapping, Sequence

from kvserve.cluster.host import Host
from kvserve.cluster.redis import new_password
from kvserve.cluster.runas import PREFLIGHT, ROLES, RunAs, accounts, role_of
from kvserve.cluster.spec import ClusterSpec

log = logging.getLogger(__name__)
__all__ = [
    "DEFAULT_SUBNET",
    "DEFAULT_TAG",
    "PREFLIGHT",
    "NetHosts",
    "NetnsError",
    "RunAs",
    "accounts",
    "ip",
    "unavailable",
]

DEFAULT_SUBNET = "198.51.100.0/24"
DEFAULT_TAG = "kvs"
TAG = re.compile(r"[a-z][a-z0-9]{0,7}")
"""A tag keeps every interface name within Linux's 15 characters (``<tag>v<i>``)."""
NAME = re.compile(r"[A-Za-z0-9_.-]+")


class NetnsError(RuntimeError):
    """An ``ip`` command failed; the message names the command and its error."""


def ip(*args: str) -> str:
    """Run ``ip args``; returns its output or raises :class:`NetnsError` with its stderr."""
    binary = shutil.which("ip")
    if binary is None:
        raise NetnsError("`ip` (iproute2) is not installed: apt-get install iproute2")
    done = subprocess.run([binary, *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        hint = " (needs root: CAP_NET_ADMIN)" if "ermission" in done.stderr else ""
        raise NetnsError(f"ip {' '.join(args)} failed{hint}: {done.stderr.strip()}")
    return done.stdout


class NetHosts:
    """Network namespaces as separate hosts (see the module docstring for the lifecycle).

    ``run_as``: the account each role's processes run as (:func:`accounts`, by
    :func:`role_of`), or one :class:`RunAs` for every process; None keeps the launcher's
    own (root)."""

    def __init__(
        self,
        names: Sequence[str],
        subnet: str = DEFAULT_SUBNET,
        tag: str = DEFAULT_TAG,
        run_as: RunAs | Mapping[str, RunAs] | None = None,
    ) -> None:
        if not TAG.fullmatch(tag):
            raise ValueError(f"tag must be 1-8 lowercase letters or digits, got {tag!r}")
        bad = [n for n in names if not NAME.fullmatch(n)]
        if bad or len(set(names)) != len(names) or not names:
            raise ValueError(f"names must be distinct words, got {list(names)}")
        net = ipaddress.ip_network(subnet)
        if net.version != 4:
            raise ValueError(f"subnet must be IPv4, got {subnet}")
        addresses = list(itertools.islice(net.hosts(), len(names) + 1))
        if len(addresses) < len(names) + 1:
            raise ValueError(f"{subnet} has too few addresses for {len(names)} hosts")
        self.tag = tag
        self.prefixlen = net.prefixlen
        self.bridge = f"{tag}br"
        self.gateway = str(addresses[0])
        """This machine's own address on the bridge."""
        self.names = list(names)
        self.addresses = {n: str(a) for n, a in zip(names, addresses[1:], strict=False)}
        self._veth = {n: f"{tag}v{i}" for i, n in enumerate(names)}
        roles = dict.fromkeys(ROLES, run_as) if isinstance(run_as, RunAs) else run_as
        self.run_as: dict[str, RunAs] | None = dict(roles) if roles else None
        """Each role's account (None: the launcher's own)."""

    def namespace(self, name: str) -> str:
        return f"{self.tag}-{name}"

    def prefix(self, name: str) -> tuple[str, ...]:
        """The argv prefix that runs a command on host ``name`` (as its role's account)."""
        account = self.run_as[role_of(name)].prefix() if self.run_as is not None else ()
        return ("ip", "netns", "exec", self.namespace(name), *account)

    def hosts(self) -> dict[str, Host]:
        return {n: Host(self.addresses[n], self.prefix(n)) for n in self.names}

    @classmethod
    def for_spec(
        cls,
        spec: ClusterSpec,
        subnet: str = DEFAULT_SUBNET,
        tag: str = DEFAULT_TAG,
        run_as: RunAs | Mapping[str, RunAs] | None = None,
    ) -> NetHosts:
        """One host for each process of ``spec`` (:meth:`ClusterSpec.process_names`)."""
        return cls(spec.process_names(), subnet, tag, run_as)

    def place(self, spec: ClusterSpec) -> ClusterSpec:
        """``spec`` with every process on its own host; Redis, now reachable from other
        hosts, gets a password made up for this run if ``spec`` has none."""
        password = spec.cluster.redis_password or new_password()
        cluster = dataclasses.replace(spec.cluster, redis_password=password)
        return dataclasses.replace(spec, hosts=self.hosts(), cluster=cluster)

    # -- lifecycle -------------------------------------------------------------------------

    def create(self) -> NetHosts:
        """Make the bridge, namespaces and links (step 2)."""
        self.destroy()
        try:
            ip("link", "add", self.bridge, "type", "bridge")
            ip("addr", "add", f"{self.gateway}/{self.prefixlen}", "dev", self.bridge)
            ip("link", "set", self.bridge, "up")
            for name in self.names:
                self._add_host(name)
        except BaseException:
            self.destroy()
            raise
        log.info("%d hosts on %s via %s", len(self.names), self.bridge, self.gateway)
        return self

    def _add_host(self, name: str) -> None:
        ns, outer, inner = self.namespace(name), self._veth[name], f"{self._veth[name]}p"
        ip("netns", "add", ns)
        ip("-n", ns, "link", "set", "lo", "up")
        ip("link", "add", outer, "type", "veth", "peer", "name", inner)
        ip("link", "set", inner, "netns", ns)
        ip("-n", ns, "link", "set", inner, "name", "eth0")
        ip("-n", ns, "addr", "add", f"{self.addresses[name]}/{self.prefixlen}", "dev", "eth0")
        ip("-n", ns, "link", "set", "eth0", "up")
        ip("link", "set", outer, "master", self.bridge)
        ip("link", "set", outer, "up")

    def link_down(self, name: str) -> None:
        """Cut host ``name`` off the network (step 4)."""
        ip("link", "set", self._veth[name], "down")

    def link_up(self, name: str) -> None:
        ip("link", "set", self._veth[name], "up")

    def _our_links(self) -> list[str]:
        return [link for link in _links() if link in (self.bridge, *self._veth.values())]

    def _our_namespaces(self) -> list[str]:
        return [ns for ns in _namespaces() if ns.startswith(f"{self.tag}-")]

    def existing(self) -> list[str]:
        """This tag's namespaces and links that exist now (none after ``destroy``)."""
        return self._our_namespaces() + self._our_links()

    def destroy(self) -> None:
        """Delete every link and namespace of this tag; idempotent (step 5). A veth goes
        with its peer, and with a namespace deleted, asynchronously: one already gone is
        fine."""
        for link in self._our_links():
            _tolerate_gone("link", "del", link)
        for ns in self._our_namespaces():
            _tolerate_gone("netns", "del", ns)

    @contextlib.contextmanager
    def made(self) -> Iterator[NetHosts]:
        """``create()``, then ``destroy()`` on leaving the block, however it is left."""
        self.create()
        try:
            yield self
        finally:
            self.destroy()


def unavailable() -> str:
    """'' when this process can make network namespaces (root with CAP_NET_ADMIN and
    iproute2), else why not; tries by making and deleting one."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"kvsprobe-{os.getpid()}"
    try:
        ip("netns", "add", probe)
        ip("netns", "del", probe)
    except NetnsError as exc:
        return str(exc)
    return ""


def _namespaces() -> list[str]:
    return [line.split()[0] for line in ip("netns", "list").splitlines() if line.strip()]


LINK = re.compile(r"^\d+: ([^:@]+)[@:]")


def _links() -> list[str]:
    """Names of this (root) namespace's network links."""
    return [m.group(1) for line in ip("-o", "link", "show").splitlines() if (m := LINK.match(line))]


def _tolerate_gone(*args: str) -> None:
    try:
        ip(*args)
    except NetnsError as exc:
        if "Cannot find" not in str(exc) and "No such file" not in str(exc):
            raise

"""``kvserve up``: a whole cluster on this machine in one command.

1. The flags (each also a ``KVSERVE_*`` variable) become a :class:`ClusterSpec`: the
   cluster secret and the Redis password are made up for this run unless given
   (``KVSERVE_CLUSTER_SECRET``, ``KVSERVE_REDIS_PASSWORD``), the router's API keys are
   ``KVSERVE_API_KEY``'s; with ``--free-ports`` every port is a free loopback port
   instead; with ``--hosts`` every process gets its own network host first
   (:class:`kvserve.cluster.netns.NetHosts`: a namespace with its own address on a private
   bridge), where it runs as an unprivileged account of its role's
   (:func:`kvserve.cluster.runas.accounts`: the one who ran sudo, else one made up for each
   role; checked before anything starts) and loads the build outputs the launcher prepared
   where it cannot write (:mod:`kvserve.cluster.shared_cache`), and the hosts (and those
   outputs) are removed again after step 5;
2. the :class:`Cluster` starts mooncake_master, Redis (always with a password, or an ACL
   user with ``--redis-username``), the workers (each pinned to its own cores when there
   are enough) and the router, and waits until all are healthy; every secret reaches a
   process through its environment, and only the processes that use it
   (:mod:`kvserve.cluster.spec`);
3. the URLs and a sample ``curl`` line go to stderr (no secret: the line names the
   ``KVSERVE_API_KEY`` variable, not its value);
4. it blocks until Ctrl-C or SIGTERM (exit 0), or until the router, Redis or the master
   dies (exit 1; a dead worker is only reported, the router routes around it);
5. everything is stopped in reverse order, also when start-up fails.

The defaults fit a 2-core machine with SmolLM2: 1 prefill + 1 decode worker on one core
each, 256 MiB of pool memory per worker.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import signal
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from types import FrameType
from typing import Any

from kvserve.cluster import shared_cache
from kvserve.cluster.launch import Cluster, ClusterSpec
from kvserve.cluster.netns import NetHosts, NetnsError, accounts
from kvserve.cluster.up_settings import spec_from_args as spec_from_args  # the tests import it here

ROUTER_PATHS = {"OpenAI API": "/v1", "metrics": "/metrics", "cache stats": "/v1/cache/stats"}
SECRETS_NOTE = (
    "in each process's environment only (KVSERVE_CLUSTER_SECRET, KVSERVE_REDIS_PASSWORD: "
    "made up for this run unless given; KVSERVE_API_KEY: the router's)"
)


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    """SIGTERM leaves the serving loop (or start-up) exactly as Ctrl-C does."""
    raise KeyboardInterrupt


def _announce(cluster: Cluster, seconds: float) -> None:
    spec = cluster.spec
    counts = ", ".join(f"{len(a)} {role}" for role, a in cluster.worker_addresses.items())
    lines = [f"kvserve up: cluster {spec.cluster.cluster!r} ready in {seconds:.1f}s ({counts})"]
    lines += [f"  {what:<12} {cluster.router_url}{path}" for what, path in ROUTER_PATHS.items()]
    if len(cluster.routers.names) > 1:  # behind nginx on router_url
        lines += [f"  {name:<12} {url}" for name, url in cluster.routers.urls.items()]
    for name in cluster.worker_names:
        scheme = "grpcs" if spec.cluster_config.grpc_tls else "grpc"
        plan = cluster.plan_of(name)
        metrics = f"  {plan.metrics_url}" if plan.metrics_port else ""
        lines.append(f"  {name:<12} {scheme}://{plan.address}{metrics}")
    lines.append(f"  {'redis':<12} {cluster.redis_url}")
    if cluster.master is not None:
        ha = spec.pool_ha
        lines.append(f"  {'pool master':<12} {ha.address if ha else cluster.master.rpc_address}")
    lines.append(f"  {'logs':<12} {cluster.log_dir}")
    lines.append(f"  {'secrets':<12} {SECRETS_NOTE}")
    message = {"role": "user", "content": "Hello!"}
    body = json.dumps({"model": _model_name(cluster), "messages": [message]})
    auth = " -H 'Authorization: Bearer <a key of KVSERVE_API_KEY>'" if spec.api_key else ""
    lines.append(
        f"try: curl -s {cluster.router_url}/v1/chat/completions{auth} "
        f"-H 'Content-Type: application/json' -d '{body}'"
    )
    lines.append("(Ctrl-C stops the cluster)")
    print("\n".join(lines), file=sys.stderr, flush=True)


def client_key(api_key: str) -> str:
    """A key the router accepts, from its API keys setting (``key`` or ``tenant=key``
    entries, comma-separated: :mod:`router.api.auth`): the first entry's key; '' for none."""
    tenant, sep, key = api_key.split(",")[0].strip().partition("=")
    return key if sep else tenant


def _router_json(cluster: Cluster, path: str, body: object = None, timeout: float = 2) -> Any:
    """The router's JSON answer to a GET of ``path`` (a POST of ``body`` when given), with
    a key it accepts when it has API keys; OSError (urllib's HTTPError among them) when it
    cannot answer."""
    headers = {"Content-Type": "application/json"}
    if cluster.spec.api_key:
        headers["Authorization"] = f"Bearer {client_key(cluster.spec.api_key)}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(cluster.router_url + path, data=data, headers=headers)
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.load(response)


def ask(cluster: Cluster, question: str, max_tokens: int = 64) -> str:
    """The answer to one chat message, greedy, through the router's OpenAI API (with a key
    it accepts); RuntimeError naming the router's answer when there is none."""
    body = {
        "model": _model_name(cluster),
        "messages": [{"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    try:
        reply = _router_json(cluster, "/v1/chat/completions", body, timeout=300)
        return str(reply["choices"][0]["message"]["content"])
    except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise RuntimeError(f"--ask got no answer from the router: {exc}") from exc


def _model_name(cluster: Cluster) -> str:
    """The first model the router serves (its ``/v1/models``), for the sample command."""
    try:
        return str(_router_json(cluster, "/v1/models")["data"][0]["id"])
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return "default"


def _serve(cluster: Cluster) -> int:
    """Serve until a process the cluster cannot do without exits (1). A dead worker is
    reported once (the routers route around it); one of several routers is reported and
    started again (the balancer leaves it out meanwhile)."""
    reported: set[str] = set()
    essential = {"router", "balancer", "redis", "mooncake_master", "mooncake_metadata"}
    while True:
        time.sleep(1.0)
        for name in sorted(set(cluster.dead()) - reported):
            proc = cluster.process(name)
            print(f"kvserve up: {name} exited ({proc.log_path})", file=sys.stderr, flush=True)
            if name in essential:
                print(proc.log_tail(), file=sys.stderr, flush=True)
                return 1
            if name in cluster.routers.names:
                _restart_router(cluster, name)
            else:
                reported.add(name)


def _restart_router(cluster: Cluster, name: str) -> None:
    try:
        cluster.restart(name)
        print(f"kvserve up: {name} started again", file=sys.stderr, flush=True)
    except RuntimeError as exc:  # tried again on the next round
        print(f"kvserve up: {name} did not start again: {exc}", file=sys.stderr, flush=True)


def net_hosts(spec: ClusterSpec, args: argparse.Namespace) -> NetHosts:
    """The hosts of ``--hosts``: one per process of ``spec``, each process run as its role's
    account of ``--hosts-user`` (:func:`accounts`)."""
    return NetHosts.for_spec(spec, args.hosts_subnet, args.hosts_tag, accounts(args.hosts_user))


def as_accounts(spec: ClusterSpec, net: NetHosts, cache: Path) -> ClusterSpec:
    """``spec`` for processes run as ``net``'s accounts by root: its model as they see it
    (the same directory for the routers and the workers, who read it; ValueError if not),
    and every account given ``cache`` (:mod:`kvserve.cluster.shared_cache`, filled here)."""
    assert net.run_as is not None
    seen = {net.run_as[r].model_dir(spec.python, spec.engine.model) for r in ("router", "worker")}
    if len(seen) != 1:
        raise ValueError(f"the routers and the workers would read different models: {seen}")
    shared_cache.prepare(cache)
    net.run_as = {role: dataclasses.replace(a, cache=str(cache)) for role, a in net.run_as.items()}
    return dataclasses.replace(spec, engine=dataclasses.replace(spec.engine, model=seen.pop()))


def run(args: argparse.Namespace) -> int:
    """Start the cluster, serve until Ctrl-C/SIGTERM, stop it (steps 1-5)."""
    logging.basicConfig(level=logging.INFO, format="kvserve up: %(message)s", stream=sys.stderr)
    spec = spec_from_args(args)
    try:
        net = net_hosts(spec, args) if args.hosts else None  # a bad --hosts-user: ValueError
        with contextlib.ExitStack() as stack:
            if net is not None and net.run_as is not None and os.geteuid() == 0:
                cache = stack.enter_context(tempfile.TemporaryDirectory(prefix="kvserve-cache-"))
                spec = as_accounts(spec, net, Path(cache))
            if net is not None:
                stack.enter_context(net.made())
            return _run(Cluster(net.place(spec) if net is not None else spec), args)
    except (NetnsError, ValueError) as exc:
        print(f"kvserve up: error: {exc}", file=sys.stderr, flush=True)
        return 1


def _run(cluster: Cluster, args: argparse.Namespace) -> int:
    previous = signal.signal(signal.SIGTERM, _raise_stop)
    begin = time.monotonic()
    try:
        cluster.start()
        _announce(cluster, time.monotonic() - begin)
        if args.ask:
            print(ask(cluster, args.ask), flush=True)
            if args.exit_after_ask:
                return 0
        return _serve(cluster)
    except KeyboardInterrupt:
        return 0
    except RuntimeError as exc:
        print(f"kvserve up: error: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second signal must not cut stop()
        old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
        print("kvserve up: stopping", file=sys.stderr, flush=True)
        cluster.stop()
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, previous)

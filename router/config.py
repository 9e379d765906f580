"""The router's own settings (flags ``--router-port`` etc., env ``KVSERVE_*``).

The router's full configuration is this :class:`RouterConfig` plus
:class:`proto.registry.ClusterConfig` (where the worker registry lives) plus
:class:`kvpool.config.PoolConfig` (``pool_master`` / ``pool_metadata_server``: the router
joins the pool as a pure client, with no segment of its own, for prefix lookups).
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass, field
from pathlib import Path

from proto.limits import MAX_LEASE_S
from router.api.auth import ApiKeys, parse_api_keys
from router.api.edge import check_allowed_hosts, served_hosts
from router.control.ratio_config import RatioConfig

POLICIES = ("random", "round_robin", "least_loaded", "cache_aware")
KV_HANDOFFS = ("push", "pool")
CONTROLLER_PREFIX = "controller_"
"""The flags and variables of :attr:`RouterConfig.ratio` start with this
(``--controller-target``, ``KVSERVE_CONTROLLER_TARGET``; see :mod:`kvserve.settings`)."""
ROUTER_ID_MAX = 64
ROUTER_ID = re.compile(rf"[A-Za-z0-9_.:-]{{1,{ROUTER_ID_MAX}}}")
"""A valid router id (:attr:`RouterConfig.router_id`)."""
_NOT_IN_ID = re.compile(r"[^A-Za-z0-9_.:-]")


@dataclass(frozen=True)
class RouterConfig:
    """How the router serves and places requests.

    - ``router_host`` / ``router_port``: where the OpenAI-compatible HTTP API listens.
    - ``allowed_hosts``: comma-separated names (or addresses) clients reach this router by,
      besides ``router_host`` and the loopback names; ``*``: any. A request whose ``Host``
      header names none of them gets 400 (:mod:`router.api.edge`: a web page that rebinds its
      own name to this machine cannot drive it). Bound to every interface (``0.0.0.0``),
      the router cannot know its names and takes any ``Host`` unless this lists them: list
      them there.
    - ``router_id``: this router's name among the cluster's routers: 1-64 letters, digits
      and ``_.:-``; empty = ``<hostname>:<router_port>``
      (:meth:`RouterConfig.resolved_router_id`). Every response carries it (header
      ``X-Kvserve-Router``), as do ``/metrics`` (``kvserve:router_info``) and
      ``/v1/cache/stats``; it holds the P:D controller's lease. Give each router its own.
    - ``policy``: placement policy of the conductor.
    - ``disagg_threshold_tokens``: when the part of a prompt that is not in the pool is at
      most this many tokens, the decode worker may prefill it itself (conditional
      disaggregation: it does unless a prefill worker would give the first token sooner,
      :func:`router.placement.policies.prefill_remotely`); longer ones always go to a prefill
      worker; 0 disaggregates every request when a prefill worker exists.
    - ``reserve_lease_s``: a decode reservation is freed if prefill does not arrive in time.
    - ``kv_handoff``: how a prompt's KV reaches the decode worker. ``push`` (default): the
      router asks the decode worker for a push target with its reservation; where it offers
      one (a KV cache the pool moves in place), the prefill worker writes each layer straight
      into its pages as it is computed and the pool in the background, and a push that
      fails falls back to the pool (:mod:`workers.handoff.pusher`); where it offers none, the pool.
      ``pool``: always through the pool (layer-wise, the decode worker landing the layers).
      docs/benchmarks.md, "Direct push against the pool", has the measurements.
    - ``request_timeout_s``: end-to-end deadline of one request (every RPC shares it).
    - ``served_model_name``: the model name clients must use; empty = the workers' ``model``.
    - ``tokenizer_dir``: local model directory with the tokenizer and chat template (no hub
      access, ever). The router reads no other: the ``model_dir`` in the workers' registry
      records is never used as a path (anyone who can write to Redis could name any
      directory there). Empty: every request that needs the tokenizer gets 503, and the
      start logs why; ``kvserve up`` passes the workers' model directory.
    - ``max_body_bytes``: larger request bodies get HTTP 413.
    - ``max_connections``: client connections held at once (:func:`router.main.server_config`):
      a request gets 503 while this many are open, its own counted (uvicorn's
      ``limit_concurrency``), and a connection accepted beyond it is closed at once, so a
      flood of idle or slow clients cannot exhaust the router's file descriptors. 512 is
      far more streams than a cluster's decode slots and well under the usual 1024 files.
    - ``header_timeout_s``: a connection must deliver each request's line and headers
      within this long of opening or of its previous response, else it is closed (a client
      sending its headers byte by byte holds a socket no longer; uvicorn has no such
      timeout). 10 s is ample for any real client: a head is at most h11's 16 KiB.
    - ``keep_alive_timeout_s``: an idle connection is closed this long after its last
      response (uvicorn's ``timeout_keep_alive``, whole seconds; uvicorn's default).
    - ``pool_lookup``: ask the pool how much of each prompt it holds (when it cannot be
      joined, the router logs it and counts every lookup as 0).
    - ``pool_lookup_timeout_s``: a lookup not answered within this long counts as no pool
      hit (:class:`router.placement.pool_lookup.PoolLookup`): the pool is a cache, and a frozen
      master must not hold up requests. The lookup is one batched RPC that answers in milliseconds;
      0.5 s bounds what a frozen master adds to a first token.
    - ``controller``: run the P:D ratio controller (:mod:`router.control.controller`), which moves
      workers between the prefill and decode pools. Of several routers run with it, one
      decides at a time: the holder of the controller's lease in Redis
      (:mod:`router.control.lease`); another takes over when it stops or dies.
    - ``controller_interval_s``: how often the controller evaluates (5 s evaluations x
      patience 2 act within about 10 s of a sustained miss) and renews its lease (whose
      TTL is 3 intervals, at least 3 s: :func:`router.control.lease.lease_ttl_s`).
    - ``ratio``: the controller's policy, :class:`router.control.ratio.RatioConfig` (SLOs, target,
      window, hysteresis, bounds), whose fields are the flags ``--controller-<field>``.
    - ``api_key``: empty = no authentication; else comma-separated keys, each optionally
      ``tenant=key``, and every route but ``/health`` needs ``Authorization: Bearer <key>``
      (:mod:`router.api.auth`). Prefer the environment (``KVSERVE_API_KEY``) to the flag, which
      other users can read in the process list; the key is never printed (``repr=False``).
    - ``isolate_tenants``: the prefix cache of a tenant is its own (a key given without a
      tenant is a tenant of its own: :func:`router.api.auth.bare_key_tenant`): its tenant name
      salts the pool keys of its requests (with the request's ``cache_salt``), so that no
      other tenant can hit its prefixes, nor learn their presence from ``cached_tokens`` or
      a faster first token. Keys meant to share a cache are given one tenant name.
    - ``admission_ttft_s``: refuse (HTTP 429 with ``Retry-After``) a request whose predicted
      time to first token, queue included, exceeds this (:mod:`router.placement.admission`); 0 =
      off. Default off: the prediction divides by each worker's measured prefill speed, a
      since-start average that per-step overhead dominates on small CPU machines (measured
      here under load: 2-16 tokens/s after a few short prompts, so a 300-token prompt on an
      idle worker predicts 150 s), and a shedder that refuses work the cluster would have
      served is worse than none. Production: set it to the longest first-token wait your
      clients and proxies tolerate (e.g. 30, under nginx's 60 s ``proxy_read_timeout``),
      once ``kvserve:prefill_tokens_per_second`` shows steady speeds.
    """

    router_host: str = "127.0.0.1"
    router_port: int = 8000
    router_id: str = ""
    allowed_hosts: str = ""
    policy: str = field(default="cache_aware", metadata={"choices": POLICIES})
    disagg_threshold_tokens: int = 256
    reserve_lease_s: float = 30.0
    kv_handoff: str = field(default="push", metadata={"choices": KV_HANDOFFS})
    request_timeout_s: float = 600.0
    served_model_name: str = ""
    tokenizer_dir: str = ""
    max_body_bytes: int = 1 << 20
    max_connections: int = 512
    header_timeout_s: float = 10.0
    keep_alive_timeout_s: int = 5
    pool_lookup: bool = True
    pool_lookup_timeout_s: float = 0.5
    controller: bool = False
    controller_interval_s: float = 5.0
    ratio: RatioConfig = field(
        default_factory=RatioConfig, metadata={"flag_prefix": CONTROLLER_PREFIX}
    )
    api_key: str = field(default="", repr=False)
    isolate_tenants: bool = True
    admission_ttft_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.router_host:
            raise ValueError("router_host must be an address to bind, e.g. 127.0.0.1")
        if not 1 <= self.router_port <= 65535:
            raise ValueError(f"router_port must be in 1..65535, got {self.router_port}")
        if self.router_id and not ROUTER_ID.fullmatch(self.router_id):
            raise ValueError(
                f"router_id must be 1-{ROUTER_ID_MAX} letters, digits and _.:- "
                f"(empty: <hostname>:<router_port>), got {self.router_id!r}"
            )
        check_allowed_hosts(self.allowed_hosts)
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {self.policy!r}")
        if self.disagg_threshold_tokens < 0:
            raise ValueError("disagg_threshold_tokens must be >= 0 (0 = always disaggregate)")
        if self.kv_handoff not in KV_HANDOFFS:
            raise ValueError(f"kv_handoff must be one of {KV_HANDOFFS}, got {self.kv_handoff!r}")
        if not 0 < self.reserve_lease_s <= MAX_LEASE_S:
            raise ValueError(f"reserve_lease_s must be in (0, {MAX_LEASE_S:g}] seconds")
        if self.request_timeout_s <= 0:
            raise ValueError("request_timeout_s must be positive (seconds)")
        if self.max_body_bytes < 1024:
            raise ValueError("max_body_bytes must be at least 1024")
        if self.max_connections < 2:
            raise ValueError("max_connections must be at least 2 (it counts the asking one)")
        if not self.header_timeout_s > 0:
            raise ValueError("header_timeout_s must be positive (seconds)")
        if self.keep_alive_timeout_s < 1:
            raise ValueError("keep_alive_timeout_s must be at least 1 (whole seconds)")
        if not self.pool_lookup_timeout_s > 0:
            raise ValueError("pool_lookup_timeout_s must be positive (seconds)")
        if self.tokenizer_dir and not (Path(self.tokenizer_dir) / "tokenizer.json").is_file():
            raise ValueError(
                f"tokenizer_dir {self.tokenizer_dir!r} has no tokenizer.json: point it at a "
                "local Hugging Face model directory (the one the workers serve)"
            )
        if not self.controller_interval_s > 0:
            raise ValueError("controller_interval_s must be positive (seconds)")
        _ = self.api_keys  # raises, without the key, when malformed
        if not self.admission_ttft_s >= 0:
            raise ValueError("admission_ttft_s must be >= 0 seconds (0 = no admission control)")

    @property
    def served_hosts(self) -> frozenset[str] | None:
        """The ``Host`` names this router answers (None: any),
        :func:`router.api.edge.served_hosts`."""
        return served_hosts(self.router_host, self.allowed_hosts)

    @property
    def api_keys(self) -> ApiKeys:
        """The parsed ``api_key`` (empty: no authentication)."""
        return parse_api_keys(self.api_key)

    def resolved_router_id(self) -> str:
        """The router's id: ``router_id``, or for none ``<hostname>:<router_port>``, the
        host name's characters outside ``[A-Za-z0-9_.-]`` made ``_`` and the name cut to
        fit :data:`ROUTER_ID_MAX` (``router`` for an empty one). Resolved once, by the
        router service when it is built: the host name is read then."""
        if self.router_id:
            return self.router_id
        port = f":{self.router_port}"
        host = _NOT_IN_ID.sub("_", socket.gethostname().replace(":", "_")) or "router"
        return host[: ROUTER_ID_MAX - len(port)] + port

    @property
    def reserve_lease_ms(self) -> int:
        return max(1, round(self.reserve_lease_s * 1000))

"""A round-robin HTTP load balancer in front of several servers: Debian's nginx
(``nginx-light``, installed by ``scripts/setup.sh``), the balancer users already run, never
one written here. Used in front of several routers (``kvserve up --routers N``,
:mod:`kvserve.cluster.routers`) and of several ``vllm serve`` (``kvserve bench peer``,
:func:`kvserve.bench.peer.launch.round_robin`).

What the configuration (:func:`nginx_conf`) promises a client:

- requests go round-robin over the upstreams; streaming passes through unbuffered;
- an upstream that refuses or drops a connection before answering is marked down for
  :data:`FAIL_TIMEOUT_S` after one failure (``max_fails=1``) and the request goes to the
  next one: nginx passes a request on only while nothing of it was sent upstream, so a POST
  is never sent twice; a request already answered in part by an upstream that then dies is
  cut (the client sees its connection end: "lost", not retried);
- the client's ``Host`` header reaches the upstream as sent (routers check it against the
  names they serve, :mod:`router.api.edge`);
- every answer carries ``X-Kvserve-Upstream``: the address(es) nginx tried, in order
  (also on nginx's own 502/504), so a client can tell which router a lost request was on.

Lifecycle of :class:`Balancer`: the configuration is written into ``folder`` (with nginx's
temporary folders), nginx is started in the foreground under
:class:`~kvserve.cluster.processes.ManagedProcess` (log ``<log_dir>/<name>.log``),
:meth:`wait_ready` polls a path through it, :meth:`stop` stops it; the caller owns
``folder``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

from kvserve.cluster.health import http_ok
from kvserve.cluster.processes import ManagedProcess, debian_binary

FAIL_TIMEOUT_S = 2
"""How long an upstream that failed once is left out (nginx's ``fail_timeout``); then it is
tried again by the next request that reaches it."""
CONNECT_TIMEOUT_S = 2
"""How long nginx waits to connect to an upstream before trying the next one."""


def nginx_conf(folder: Path, host: str, port: int, upstreams: Sequence[str], user: str = "") -> str:
    """nginx's configuration: listen on ``host:port``, round-robin over ``upstreams``
    (``host:port`` each), everything under ``folder`` (module docstring), its workers run as
    ``user`` ('' : nginx's default). docker-compose.ha.yml's nginx runs
    ``deploy/nginx-routers.conf``, this function's text for the compose routers."""
    servers = "".join(
        f"    server {u} max_fails=1 fail_timeout={FAIL_TIMEOUT_S}s;\n" for u in upstreams
    )
    user_line = f"user {user};\n" if user else ""
    return f"""{user_line}worker_processes 1;
daemon off;
pid {folder}/nginx.pid;
error_log {folder}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {folder}/body;
  proxy_temp_path {folder}/proxy;
  fastcgi_temp_path {folder}/fastcgi;
  uwsgi_temp_path {folder}/uwsgi;
  scgi_temp_path {folder}/scgi;
  upstream servers {{
{servers}  }}
  server {{
    listen {host}:{port};
    location / {{
      proxy_pass http://servers;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host $http_host;
      proxy_buffering off;
      proxy_connect_timeout {CONNECT_TIMEOUT_S}s;
      proxy_next_upstream error timeout;
      proxy_read_timeout 3600s;
      client_max_body_size 64m;
      add_header X-Kvserve-Upstream $upstream_addr always;
    }}
  }}
}}
"""


class Balancer:
    """nginx on ``host:port`` over ``upstreams`` (lifecycle in the module docstring)."""

    def __init__(
        self,
        folder: Path,
        log_dir: Path,
        host: str,
        port: int,
        upstreams: Sequence[str],
        name: str = "balancer",
    ) -> None:
        self.folder, self.url = folder, f"http://{host}:{port}"
        user = "root root" if os.geteuid() == 0 else ""  # else nginx would switch to nobody
        self._conf = nginx_conf(folder, host, port, upstreams, user)
        argv = [
            debian_binary("nginx", "nginx-light"),
            "-c",
            str(folder / "nginx.conf"),
            "-p",
            str(folder),
        ]
        self.process = ManagedProcess(name, argv, log_dir / f"{name}.log")

    def start(self) -> None:
        """Write the configuration and start nginx (not waiting for it)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "nginx.conf").write_text(self._conf)
        self.process.start()

    def wait_ready(self, ready: str, timeout_s: float) -> None:
        """Poll the path ``ready`` through nginx until it answers 200; the process's failure
        (naming its log) when it exits or ``timeout_s`` runs out."""
        deadline = time.monotonic() + timeout_s
        while not http_ok(self.url + ready, timeout=2.0):
            if not self.process.running or time.monotonic() > deadline:
                raise self.process.failure("did not serve")
            time.sleep(0.2)

    def stop(self, grace: float) -> None:
        self.process.stop(grace)

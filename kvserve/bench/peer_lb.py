"""Round-robin over several servers for ``kvserve bench peer``: Debian's nginx
(``nginx-light``, installed by ``scripts/setup.sh``) as the load balancer users run in
front of independent ``vllm serve`` instances.

Lifecycle of :func:`round_robin`: a configuration in a new temporary folder (upstream of
the servers, round-robin; streaming passed through unbuffered; no access log), nginx
started in the foreground on a free loopback port under
:class:`kvserve.cluster.processes.ManagedProcess`, its ``/v1/models`` polled until it
answers through nginx; on exit nginx is stopped and the folder removed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from kvpool.net import free_local_ports
from kvserve.cluster.launch import http_ok
from kvserve.cluster.processes import ManagedProcess


def nginx_conf(folder: Path, port: int, upstreams: Sequence[str]) -> str:
    """nginx's configuration: listen on 127.0.0.1:``port``, round-robin over
    ``upstreams`` (``host:port`` each), everything under ``folder``."""
    servers = "".join(f"    server {u};\n" for u in upstreams)
    user = "user root root;\n" if os.geteuid() == 0 else ""
    return f"""{user}worker_processes 1;
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
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://servers;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_read_timeout 3600s;
      client_max_body_size 64m;
    }}
  }}
}}
"""


@contextlib.contextmanager
def round_robin(urls: Sequence[str], log_dir: Path, timeout_s: float = 30.0) -> Iterator[str]:
    """nginx round-robin over ``urls`` (``http://host:port`` each); yields its base URL."""
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(nginx).is_file():
        raise RuntimeError("no nginx: install Debian's nginx-light (scripts/setup.sh does)")
    folder = Path(tempfile.mkdtemp(prefix="kvserve-lb-"))
    try:
        (port,) = free_local_ports(1)
        upstreams = [u.removeprefix("http://").rstrip("/") for u in urls]
        conf = folder / "nginx.conf"
        conf.write_text(nginx_conf(folder, port, upstreams))
        argv = [nginx, "-c", str(conf), "-p", str(folder)]
        proc = ManagedProcess("nginx", argv, log_dir / "nginx.log")
        url = f"http://127.0.0.1:{port}"
        try:
            proc.start()
            deadline = time.monotonic() + timeout_s
            while not http_ok(url + "/v1/models", timeout=2.0):
                if not proc.running or time.monotonic() > deadline:
                    raise proc.failure("did not serve")
                time.sleep(0.2)
            yield url
        finally:
            proc.stop(5.0)
    finally:
        shutil.rmtree(folder, ignore_errors=True)

"""Round-robin over several servers for ``kvserve bench peer``: nginx
(:class:`kvserve.cluster.balancer.Balancer`) as the load balancer users run in front of
independent ``vllm serve`` instances.

Lifecycle of :func:`round_robin`: a new temporary folder for nginx's configuration, nginx
on a free loopback port, its ``/v1/models`` polled until it answers through nginx; on exit
nginx is stopped and the folder removed.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from kvpool.net import free_local_ports
from kvserve.cluster.balancer import Balancer


@contextlib.contextmanager
def round_robin(urls: Sequence[str], log_dir: Path, timeout_s: float = 30.0) -> Iterator[str]:
    """nginx round-robin over ``urls`` (``http://host:port`` each); yields its base URL."""
    folder = Path(tempfile.mkdtemp(prefix="kvserve-lb-"))
    try:
        (port,) = free_local_ports(1)
        upstreams = [u.removeprefix("http://").rstrip("/") for u in urls]
        balancer = Balancer(folder, log_dir, "127.0.0.1", port, upstreams, name="nginx")
        try:
            balancer.start()
            balancer.wait_ready("/v1/models", timeout_s)
            yield balancer.url
        finally:
            balancer.stop(5.0)
    finally:
        shutil.rmtree(folder, ignore_errors=True)

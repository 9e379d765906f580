"""A real Prometheus server for the tests (Debian's ``prometheus`` package, which
scripts/setup.sh installs): started on loopback over a temporary directory, scraping the
targets of the config it is given, queried through its HTTP API, stopped by the test."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml  # type: ignore[import-untyped, unused-ignore]

from kvpool.net import free_local_ports

Result = list[dict[str, Any]]


def prometheus_binary() -> str:
    """The ``prometheus`` executable; fails (never skips) without one."""
    found = shutil.which("prometheus")
    assert found, "no `prometheus` on PATH: scripts/setup.sh installs Debian's package"
    return found


class Prometheus:
    """``with Prometheus(config, workdir) as prom:`` -> :meth:`query` -> stopped on exit.

    ``config``: the scrape configuration (a dict, written as YAML); data and log live in
    ``workdir``; it listens on a free loopback port. ``web_config``: its
    ``--web.config.file`` (none by default); ``authorization``: the header every request of
    this object carries then (e.g. ``Basic ...``)."""

    def __init__(
        self,
        config: dict[str, Any],
        workdir: Path,
        web_config: Path | None = None,
        authorization: str = "",
    ) -> None:
        self.workdir = workdir
        self.web_config = web_config
        self.authorization = authorization
        (self.port,) = free_local_ports(1)
        self.url = f"http://127.0.0.1:{self.port}"
        self.config_path = workdir / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(config))
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Prometheus:
        log = (self.workdir / "prometheus.log").open("wb")
        self._proc = subprocess.Popen(
            [
                prometheus_binary(),
                f"--config.file={self.config_path}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                *([f"--web.config.file={self.web_config}"] if self.web_config else []),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + 60
        while not self._ready():
            assert self._proc.poll() is None, self.log_tail()
            assert time.monotonic() < deadline, f"Prometheus not ready: {self.log_tail()}"
            time.sleep(0.5)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(10)

    def get(self, path: str, authorization: str | None = None, timeout: float = 30) -> Any:
        """``GET path`` with ``authorization`` (default: this object's); the open reply
        (``urllib.error.HTTPError`` on a status of 400 or more)."""
        request = urllib.request.Request(self.url + path)
        header = self.authorization if authorization is None else authorization
        if header:
            request.add_header("Authorization", header)
        return urllib.request.urlopen(request, timeout=timeout)

    def _ready(self) -> bool:
        try:
            with self.get("/-/ready", timeout=2) as reply:
                return bool(reply.status == 200)
        except OSError:
            return False

    def log_tail(self) -> str:
        return (self.workdir / "prometheus.log").read_text(errors="replace")[-2000:]

    def query(self, promql: str) -> Result:
        """The instant vector (or scalar, as one sample) ``promql`` gives now."""
        path = "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with self.get(path) as reply:
            body = json.load(reply)
        assert body["status"] == "success", (promql, body)
        data = body["data"]
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        result: Result = data["result"]
        return result

    def wait_for(self, promql: str, timeout: float = 60.0) -> Result:
        """``promql``'s result once it is non-empty; fails after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(promql)
            if result:
                return result
            assert time.monotonic() < deadline, f"no data for {promql!r} in {timeout:.0f}s"
            time.sleep(1.0)

"""What the kvserve connector inside vLLM needs from the worker that started vLLM.

vLLM builds the connector in its own processes (the engine core: scheduler side; the model
worker: worker side) from ``--kv-transfer-config``, which vLLM logs in full at start. So
the config names only a file (``kv_connector_extra_config["kvserve_spec"]``), and the file
(JSON, mode 0600, in a directory only its owner can enter) holds the rest: the pool and
cluster settings as the worker has them (the cluster's secret or grant among them: the
pool's block MACs and chain roots are keyed with it), the KV namespace and wire layout the
worker published in its contract, and where to send reports (:mod:`vllm_backend.reports`).

Lifecycle: the worker writes it (:meth:`ConnectorSpec.save`) before it builds vLLM's
engine, each connector reads it once (:meth:`ConnectorSpec.load`) as vLLM constructs it,
and the worker removes it once the engine is up (every connector has read it by then).
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvpool.config import PoolConfig
from kvpool.hashing import Namespace, PrefixHasher
from proto.registry import ClusterConfig

SPEC_KEY = "kvserve_spec"
"""The key of the spec file's path in ``kv_connector_extra_config``."""


@dataclass(frozen=True)
class ConnectorSpec:
    """The connector's settings (module docstring). ``wire`` is the
    :attr:`kvpool.layout.KVLayout.wire` the worker's contract promises (the connector
    refuses a vLLM cache of any other); ``reports`` the ZeroMQ endpoint of the worker's
    report socket ('' for none); ``writer`` names this worker in the metas it writes."""

    pool: PoolConfig
    cluster: ClusterConfig
    namespace: Namespace
    wire: str
    reports: str
    writer: str

    @property
    def hasher(self) -> PrefixHasher:
        """Block names of the namespace, rooted with the cluster's prefix-root key."""
        return PrefixHasher(self.namespace, self.cluster.keyring.prefix_root)

    def to_json(self) -> dict[str, Any]:
        return {
            "pool": dataclasses.asdict(self.pool),
            "cluster": dataclasses.asdict(self.cluster),
            "namespace": self.namespace.key,
            "wire": self.wire,
            "reports": self.reports,
            "writer": self.writer,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ConnectorSpec:
        """The spec ``data`` describes; ValueError (or TypeError) if it does not."""
        return cls(
            pool=PoolConfig(**data["pool"]),
            cluster=ClusterConfig(**data["cluster"]),
            namespace=Namespace.parse(data["namespace"]),
            wire=str(data["wire"]),
            reports=str(data["reports"]),
            writer=str(data["writer"]),
        )

    def save(self, path: Path) -> Path:
        """Write the spec to ``path``, readable by its owner only (created so: never
        world-readable, not even for a moment)."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(self.to_json(), out)
        return path

    @classmethod
    def load(cls, path: str | Path) -> ConnectorSpec:
        """Read a spec; ValueError naming the file if it is missing or malformed."""
        try:
            return cls.from_json(json.loads(Path(path).read_text()))
        except (OSError, ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"kvserve connector spec {path}: {exc}") from exc

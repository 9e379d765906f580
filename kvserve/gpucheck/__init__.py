"""``python -m kvserve.gpucheck``: the prepared check of the GPU path (``scripts/gpu_check.sh``).

Checks, each recorded in one JSON file with its status (``pass`` / ``fail`` / ``skip``),
figures, time and, if it failed, the error (one failing check does not stop the others):

- ``tiny_exact``: the engine against ``transformers`` on the device, the tiny model in fp32,
  greedy, token for token (:mod:`.exactness`);
- ``smollm2_logits``: SmolLM2-135M in bf16 (fp32 on a CPU), first-token logits against
  ``transformers`` in the same dtype, within a tolerance, and the same greedy tokens;
- ``pool_staged`` / ``pool_in_place``: KV pages device -> pool -> device across two
  processes, bit-exact, through the host staging slots (``--kv-staging always``) and, for
  information, in place (``never``, GPUDirect where the CUDA build allows it)
  (:mod:`.roundtrip`);
- ``bench_engine``: ``kvserve bench engine`` on the device (decode tokens/s against
  ``transformers`` in the same run).
"""

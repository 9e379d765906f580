"""vLLM as an engine behind kvserve's router and pool.

Two parts, both run inside the vLLM environment (its own virtualenv: ``scripts/setup.sh``
with ``KVSERVE_VLLM=1``; vLLM's pins conflict with the project's lock):

- the KV connector (:mod:`vllm_backend.connector`), loaded by vLLM from
  ``--kv-transfer-config``: the pool as vLLM's external KV store, under the same keyed
  block names, metas and MACs as our engine's (:mod:`vllm_backend.conn_scheduler`,
  :mod:`vllm_backend.conn_worker`; vLLM's cache layouts seen in the pool's wire order:
  :mod:`vllm_backend.layouts`);
- ``kvserve worker --engine vllm`` (:mod:`vllm_backend.server`): vLLM's async engine in
  process behind the ``Worker`` gRPC contract (:mod:`vllm_backend.servicer`).

Modules that import ``vllm`` do so at the top: nothing outside this package imports them
(``kvserve worker --engine vllm`` re-executes itself in the vLLM environment first,
:mod:`vllm_backend.launch`). The pure ones (names, plans, layouts, reservations, events)
are tested in the project's own environment too.
"""

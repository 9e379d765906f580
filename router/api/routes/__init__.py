"""The router's HTTP routes, one module per family, each an :class:`fastapi.APIRouter` that
:func:`router.api.app.create_app` includes in this order:

- :mod:`router.api.routes.generation`: ``POST /v1/completions`` and ``/v1/chat/completions``;
- :mod:`router.api.routes.info`: ``GET /v1/models`` and ``/health``;
- :mod:`router.api.routes.ops`: ``GET /metrics``, ``/v1/controller``, ``/v1/cache/stats`` and
  ``/v1/status``;
- :mod:`router.api.routes.tokens`: ``POST /tokenize``, ``/detokenize`` and ``GET /version``;
- :mod:`router.api.routes.page`: the status page, ``GET /`` and its script and style.
"""

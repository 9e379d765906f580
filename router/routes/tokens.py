"""``POST /tokenize``, ``POST /detokenize`` (vLLM's shapes) and ``GET /version``.

``/tokenize`` takes ``{"model", "prompt"}`` (a completion's text, special tokens added
unless ``add_special_tokens`` is false) or ``{"model", "messages"}`` (a chat, through the
model's template, as :mod:`router.prepare` tokenizes them) and answers ``{"count",
"max_model_len", "tokens"}``; ``/detokenize`` takes ``{"model", "tokens"}`` and answers
``{"prompt"}``: ``/detokenize`` of ``/tokenize``'s tokens gives the text back (special
tokens included). Both check the model name (404) and the ids against the vocabulary
(400), and tokenize off the event loop. ``/version`` answers the package's version.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

from fastapi import APIRouter
from starlette.requests import Request

from router import openapi
from router.errors import invalid
from router.openai_parse import parse_request
from router.prepare import check_model
from router.routes.generation import read_body
from router.service import RouterService
from router.token_models import DetokenizeRequest, TokenizeRequest

TOKEN_ERRORS = (400, 404, 413, 503)
JSON_OK = {"application/json": {"schema": {"type": "object"}}}


def package_version() -> str:
    """kvserve's installed version ("unknown" when it runs from a checkout not installed)."""
    try:
        return version("kvserve")
    except PackageNotFoundError:
        return "unknown"


def token_routes(service: RouterService, secured: bool) -> APIRouter:
    """The three routes of the module docstring (behind the API keys when ``secured``)."""
    routes = APIRouter()
    limit = service.config.max_body_bytes
    documented = openapi.responses(TOKEN_ERRORS, secured, JSON_OK)

    @routes.post(
        "/tokenize", responses=documented, openapi_extra=openapi.openapi_body(TokenizeRequest)
    )
    async def tokenize(request: Request) -> dict[str, Any]:
        req = parse_request(TokenizeRequest, await read_body(request, limit))
        check_model(service, req.model)
        tok = await service.tokenizer()
        if (req.prompt is None) == (req.messages is None):
            raise invalid("give exactly one of prompt and messages", "prompt")
        if req.messages is not None:
            if not req.messages:
                raise invalid("messages must not be empty", "messages", "invalid_value")
            messages = [m.to_template() for m in req.messages]
            try:
                ids = await service.tokenizers.off_loop(tok.encode_chat, messages)
            except ValueError as exc:
                raise invalid(str(exc), "messages") from None
        else:
            assert req.prompt is not None
            ids = await service.tokenizers.off_loop(tok.encode, req.prompt, req.add_special_tokens)
        return {"count": len(ids), "max_model_len": service.max_model_len(), "tokens": ids}

    @routes.post(
        "/detokenize", responses=documented, openapi_extra=openapi.openapi_body(DetokenizeRequest)
    )
    async def detokenize(request: Request) -> dict[str, Any]:
        req = parse_request(DetokenizeRequest, await read_body(request, limit))
        check_model(service, req.model)
        tok = await service.tokenizer()
        if any(t >= tok.vocab_size for t in req.tokens):
            raise invalid(f"token ids must be below {tok.vocab_size}", "tokens", "invalid_value")
        return {"prompt": await service.tokenizers.off_loop(tok.decode, req.tokens, False)}

    @routes.get("/version", responses=openapi.responses((), secured, JSON_OK))
    async def get_version() -> dict[str, str]:
        return {"version": package_version()}

    return routes

"""``POST /tokenize``, ``POST /detokenize`` (vLLM's shapes) and ``GET /version``.

``/tokenize`` takes ``{"model", "prompt"}`` (a completion's text, special tokens added
unless ``add_special_tokens`` is false) or ``{"model", "messages"}`` (a chat, through the
model's template, as :mod:`router.api.prepare` tokenizes them) and answers ``{"count",
"max_model_len", "tokens"}``; ``/detokenize`` takes ``{"model", "tokens"}`` and answers
``{"prompt"}``: ``/detokenize`` of ``/tokenize``'s tokens gives the text back (special
tokens included). Both check the model name (404) and the ids against the vocabulary
(400), and tokenize off the event loop. ``/version`` answers the package's version.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from starlette.requests import Request

from proto.package import package_version
from router.api import openapi
from router.api.openai_parse import parse_request
from router.api.prepare import chat_ids, check_model, check_vocabulary
from router.api.routes.generation import read_body
from router.api.token_models import DetokenizeRequest, TokenizeRequest
from router.errors import invalid
from router.service import RouterService

TOKEN_ERRORS = (400, 404, 413, 415, 503)
JSON_OK = {"application/json": {"schema": {"type": "object"}}}


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
            ids = await chat_ids(service, req.messages, tok)
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
        check_vocabulary(req.tokens, tok, "tokens")
        return {"prompt": await service.tokenizers.off_loop(tok.decode, req.tokens, False)}

    @routes.get("/version", responses=openapi.responses((), secured, JSON_OK))
    async def get_version() -> dict[str, str]:
        return {"version": package_version()}

    return routes

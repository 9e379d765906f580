"""From a parsed OpenAI body to an :class:`~router.flow.admitted.AdmittedRequest`: every check of
a request, in one place, before any worker is called.

:meth:`Preparer.prepare` runs, in this order, raising the first failure as an OpenAI-format
:class:`router.errors.APIError` (nothing is placed or sent before all pass):

1. the fields (:meth:`CompletionRequest.check` / :meth:`ChatCompletionRequest.check`:
   refused fields, ``n``, stop strings, logits processing, temperature; 400);
2. the model: 503 when no decode-capable worker is registered, 404 for another model;
3. the tokenizer (:meth:`RouterService.tokenizer`: 503 without ``--tokenizer-dir``);
4. the prompt, tokenized off the event loop (:meth:`TokenizerSlot.off_loop`): a
   completion's text with :meth:`Tokenizer.encode` (its token ids as given), a chat's
   messages with :meth:`Tokenizer.encode_chat` (400 ``messages`` when the template
   refuses them);
5. a completion's token ids against the vocabulary (400 ``prompt``);
6. the length (400 for an empty prompt, or prompt + output past the model's context
   length; the output limit is ``max_tokens``, a completion's default 16, or for a chat
   what the context leaves);
7. the tenant salt (:func:`router.api.auth.request_salt`) and the workers' sampling params
   (and how the answer is sent: stream, usage, token ids, ``n`` samples, echo, logprobs).

The route parses the body (:func:`router.api.openai_parse.parse_request`, 400) and reads it
(413) before; the flow runs the result after (:meth:`RouterService.run`).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from starlette.types import Scope

from proto.tokenization import Tokenizer
from router.api.auth import request_salt
from router.api.openai_messages import ChatMessage
from router.api.openai_models import ChatCompletionRequest, CompletionRequest
from router.errors import APIError, invalid, unavailable
from router.flow.admitted import AdmittedRequest
from router.service import RouterService

OpenAIRequest = CompletionRequest | ChatCompletionRequest


def check_model(service: RouterService, requested: str) -> None:
    """503 when no worker could serve a request now; 404 for another model."""
    if not service.serving():
        raise unavailable(
            f"no decode-capable worker is registered in cluster {service.cluster.cluster!r}"
        )
    name = service.model_name()
    if requested != name:
        raise APIError(
            404,
            f"The model '{requested}' does not exist (this server serves '{name}')",
            "model",
            "model_not_found",
        )


async def chat_ids(
    service: RouterService, messages: Sequence[ChatMessage], tok: Tokenizer
) -> list[int]:
    """``messages`` through the model's chat template, off the event loop; 400 ``messages``
    when there are none or the template refuses them (a chat completion's and
    ``/tokenize``'s step)."""
    if not messages:
        raise invalid("messages must not be empty", "messages", "invalid_value")
    try:
        template = [m.to_template() for m in messages]
        return await service.tokenizers.off_loop(tok.encode_chat, template)
    except ValueError as exc:
        raise invalid(str(exc), "messages") from None


def check_vocabulary(ids: Sequence[int], tok: Tokenizer, param: str) -> None:
    """400 ``param`` when an id of ``ids`` is outside ``tok``'s vocabulary (a completion's
    prompt ids and ``/detokenize``'s step; the models refuse negative ids)."""
    if any(t >= tok.vocab_size for t in ids):
        raise invalid(f"token ids must be below {tok.vocab_size}", param, "invalid_value")


class Preparer:
    """The checks of the module docstring, against ``service``'s workers and tokenizer."""

    def __init__(self, service: RouterService) -> None:
        self.service = service

    async def prepare(self, req: OpenAIRequest, scope: Scope, arrived_at: float) -> AdmittedRequest:
        """``req`` checked and tokenized (steps 1-7 of the module docstring); ``scope``: the
        request's ASGI scope (its tenant); ``arrived_at``: when it arrived (monotonic)."""
        req.check()
        check_model(self.service, req.model)
        tok = await self.service.tokenizer()
        if isinstance(req, CompletionRequest):
            ids = await self._completion_ids(req, tok)
            max_tokens = self._check_length(len(ids), req.max_tokens or 16, "prompt")
        else:
            ids = await chat_ids(self.service, req.messages, tok)
            max_tokens = self._check_length(len(ids), req.output_limit, "messages")
        isolate = self.service.config.isolate_tenants
        return AdmittedRequest(
            request_id=uuid.uuid4().hex,
            chat=isinstance(req, ChatCompletionRequest),
            model=req.model,
            prompt_token_ids=tuple(ids),
            params=req.wire_params(max_tokens),
            cache_salt=request_salt(scope, req.cache_salt, isolate),
            arrived_at=arrived_at,
            stream=req.stream,
            include_usage=req.include_usage,
            return_token_ids=bool(req.return_token_ids),
            n=req.n,
            echo=isinstance(req, CompletionRequest) and req.echo,
            prompt_text=req.prompt_text if isinstance(req, CompletionRequest) else None,
        )

    async def _completion_ids(self, req: CompletionRequest, tok: Tokenizer) -> list[int]:
        """The prompt's token ids (text encoded off the loop); 400 for an id outside the
        vocabulary."""
        ids = req.prompt_input()
        if isinstance(ids, str):
            ids = await self.service.tokenizers.off_loop(tok.encode, ids)
        check_vocabulary(ids, tok, "prompt")
        return ids

    def _check_length(self, prompt_tokens: int, max_tokens: int | None, param: str) -> int:
        """The output limit to use (``max_tokens``, or what the context leaves); 400 when
        the prompt is empty or prompt + output exceeds the model's context length."""
        if prompt_tokens == 0:
            raise invalid("the prompt is empty", param, "invalid_value")
        limit = self.service.max_model_len()
        if limit is None:
            if max_tokens is None:
                raise invalid("max_tokens is required: the model length is unknown", "max_tokens")
            return max_tokens
        wanted = max_tokens if max_tokens is not None else max(1, limit - prompt_tokens)
        if prompt_tokens + wanted > limit:
            raise invalid(
                f"This model's maximum context length is {limit} tokens. However, you "
                f"requested {prompt_tokens + wanted} tokens ({prompt_tokens} in the "
                f"{param}, {wanted} in the completion). Please reduce the length of the "
                f"{param} or completion.",
                param,
                "context_length_exceeded",
            )
        return wanted

"""A request the router has admitted: every check passed, nothing yet placed or sent.

:class:`AdmittedRequest` is what :mod:`router.api.prepare` makes of an HTTP request and what
the rest of the path (:meth:`router.service.RouterService.run`, :mod:`router.flow.plan`,
:mod:`router.api.routes.generation`) works from; nothing after it looks at the body again.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from proto import worker_pb2 as pb


@dataclass(frozen=True)
class AdmittedRequest:
    """A checked request, fixed before placement.

    - ``request_id``: the router's own (uuid4 hex: never from a client, never with '/');
    - ``chat``: a chat completion (else a completion): the answer's shape and id prefix;
    - ``model``: the model name, as requested (and checked to be the one served);
    - ``prompt_token_ids``: the tokenized prompt (non-empty, within the vocabulary when the
      client sent ids, prompt + output within the model's context length when known);
    - ``params``: the workers' sampling params; ``params.max_tokens`` is the output limit;
    - ``cache_salt``: the salt of its pool keys (its tenant's and its own, see
      :func:`router.api.auth.request_salt`);
    - ``arrived_at``: when the request arrived (``time.monotonic``; TTFT and the deadline
      count from it);
    - ``stream`` / ``include_usage``: how the answer is sent;
    - ``return_token_ids``: the answer carries the prompt's and the output's token ids
      (vLLM's extension, :class:`router.api.responses.Formatter`);
    - ``n``: samples of the prompt (:mod:`router.flow.samples`); ``echo``: a completion's answer
      starts with the prompt, ``prompt_text`` (None: the text of its ids).

    Whether logprobs are wanted, and how many alternatives, is in ``params``
    (``logprobs``; ``prompt_logprobs`` for an echo with logprobs).
    """

    request_id: str
    chat: bool
    model: str
    prompt_token_ids: tuple[int, ...]
    params: pb.SamplingParams
    cache_salt: str
    arrived_at: float
    stream: bool = False
    include_usage: bool = False
    return_token_ids: bool = False
    n: int = 1
    echo: bool = False
    prompt_text: str | None = None

    @property
    def logprobs(self) -> int | None:
        """Alternatives shown per token's logprob (None: no logprobs)."""
        return self.params.logprobs if self.params.HasField("logprobs") else None

    def sample(self, index: int) -> AdmittedRequest:
        """Sample ``index`` of ``n``: its own request id (``<id>-<index>``) and, when
        seeded, the seed plus ``index`` (so the samples differ, each reproducibly)."""
        if index == 0:
            return self
        params = pb.SamplingParams()
        params.CopyFrom(self.params)
        if params.HasField("seed"):
            params.seed = (params.seed + index) % (1 << 64)
        return replace(self, request_id=f"{self.request_id}-{index}", params=params)

    @property
    def max_tokens(self) -> int:
        """The output limit."""
        return self.params.max_tokens

    @property
    def response_id(self) -> str:
        """The answer's ``id``: ``chatcmpl-`` or ``cmpl-`` and the request id."""
        return ("chatcmpl-" if self.chat else "cmpl-") + self.request_id

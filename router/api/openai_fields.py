"""OpenAI's and vLLM's request fields that the router's models do not declare: those
refused unless off (:data:`REFUSED`) and those accepted and ignored (:data:`IGNORED`).
:class:`router.api.openai_models.SamplingFields` checks a request's extra fields against
:data:`REFUSED` (each route with its own ``add_special_tokens`` default)."""

from __future__ import annotations

from collections.abc import Mapping

Off = tuple[object, ...]
"""The values of a refused field that mean "off" (null always does); compared with their
JSON type, so ``0`` is not ``false``."""

REFUSED: Mapping[str, Off] = {
    # OpenAI: tools and structured output (with no tools, tool_choice "auto" is "none")
    "tools": ([],),
    "tool_choice": ("none", "auto"),
    "functions": ([],),
    "function_call": ("none", "auto"),
    "response_format": ({"type": "text"},),
    # OpenAI: what an answer carries, and how it is made
    "best_of": (1,),
    "suffix": ("",),
    "audio": (),
    "modalities": (["text"],),
    "reasoning_effort": (),
    "verbosity": (),
    "web_search_options": (),
    "moderation": (),
    # vLLM's extensions: sampling, decoding, output
    "min_p": (0, 0.0),
    "use_beam_search": (False,),
    "length_penalty": (1, 1.0),
    "bad_words": ([],),
    "allowed_token_ids": (),
    "logits_processors": (),
    "truncate_prompt_tokens": (),
    "prompt_logprobs": (),
    "include_stop_str_in_output": (False,),
    "skip_special_tokens": (True,),
    "spaces_between_special_tokens": (True,),
    "return_tokens_as_token_ids": (False,),
    "priority": (0,),
    "prompt_embeds": (),
    "mm_processor_kwargs": (),
    "kv_transfer_params": (),
    "vllm_xargs": (),
    # vLLM's extensions: structured output
    "structured_outputs": (),
    "guided_json": (),
    "guided_regex": (),
    "guided_choice": (),
    "guided_grammar": (),
    "structural_tag": (),
    "guided_decoding_backend": (),
    "guided_whitespace_pattern": (),
    # vLLM's extensions: the chat template (ours: the model's, with the generation prompt)
    "add_generation_prompt": (True,),
    "continue_final_message": (False,),
    "chat_template": (),
    "chat_template_kwargs": ({},),
    "documents": (),
}
"""Fields refused unless off, on both routes (a chat-only field sent for a completion is
refused the same way). ``add_special_tokens`` is per route:
:attr:`router.api.openai_models.SamplingFields.refused`."""

IGNORED = frozenset(
    {
        "user",  # an end-user id for abuse monitoring
        "store",  # OpenAI keeps the completion for its dashboards: nothing is kept here
        "metadata",  # tags for the stored completion
        "service_tier",  # OpenAI's capacity class; there is one here
        "safety_identifier",  # the successor of user
        "prompt_cache_key",  # a routing hint for OpenAI's prompt cache (see cache_salt)
        "prompt_cache_retention",
        "prompt_cache_options",
        "prediction",  # predicted output: speeds OpenAI up, never changes the answer
        "parallel_tool_calls",  # means something only with tools, which are refused
        "request_id",  # vLLM: the caller's id; answers carry ours
    }
)
"""Fields that change nothing that is generated: accepted and ignored (documentation; the
models do not look at them)."""


def is_off(value: object, off: Off) -> bool:
    """Whether ``value`` is one of ``off``, of the same JSON type."""
    return any(type(value) is type(o) and value == o for o in off)

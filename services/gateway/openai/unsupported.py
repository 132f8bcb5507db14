"""Request fields that OpenAI or vLLM define, that would change what a request returns, and that pdserve does
not honour (the output constraints, ``response_format`` and vLLM's ``guided_*`` and ``structured_outputs``,
are read by ``structured.py``; chat completions declare ``tools`` and ``tool_choice``, so these rules refuse
them only on completions): a request that sets one to anything but its neutral value is refused with a 400
naming it, never answered as if it had not been set. Fields that change nothing in the output (``user``,
``metadata``, ``store``, ``service_tier``, ``parallel_tool_calls`` on completions, …) stay ignored.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from services.gateway.openai.errors import OpenAIError


def _unset(value: Any) -> bool:
    return value is None


def _empty(value: Any) -> bool:
    return not value


def _one_of(*neutral: Any) -> Callable[[Any], bool]:
    return lambda value: value is None or any(value == n and type(value) is type(n) for n in neutral)


# field → (is its value neutral?, what it asks for)
_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "guided_whitespace_pattern": (_unset, "another whitespace in guided JSON"),
    "tools": (_empty, "tool calling on /v1/completions (/v1/chat/completions takes tools)"),
    "tool_choice": (_one_of("none", "auto"), "tool calling on /v1/completions (/v1/chat/completions takes it)"),
    "functions": (_empty, "function calling"),
    "function_call": (_one_of("none", "auto"), "function calling"),
    "length_penalty": (_one_of(1, 1.0), "beam search"),
    "use_beam_search": (_one_of(False), "beam search"),
    "spaces_between_special_tokens": (_one_of(True), "another rendering of special tokens"),
    "chat_template": (_unset, "a chat template per request (the gateway's --chat-template sets the server's)"),
    "documents": (_empty, "documents in the chat template"),
    "echo": (_one_of(False), "the prompt echoed in the output on chat completions (/v1/completions takes it)"),
    "prompt_logprobs": (_unset, "prompt logprobs here (/v1/completions and /v1/chat/completions take them)"),
    "logits_processors": (_empty, "logits processors"),
    "audio": (_unset, "audio output"),
    "modalities": (lambda value: value is None or value == ["text"], "non-text output"),
    "best_of": (_one_of(1), "best-of-n sampling"),  # declared (and checked) by completions, not by chat
    "prompt_embeds": (_unset, "prompt embeddings"),
    "max_completion_tokens": (_unset, "a chat completions field on completions (they take max_tokens)"),
}


def refuse_unsupported(extra: Mapping[str, Any] | None, prefix: str = "") -> None:
    """Raise a 400 naming the first field of ``extra`` (a body's fields pdserve does not declare) that asks
    for something pdserve does not do."""
    for name, value in (extra or {}).items():
        rule = _FIELDS.get(name)
        if rule is not None and not rule[0](value):
            param = f"{prefix}{name}"
            raise OpenAIError(400, f"{param}: {rule[1]} is not supported by this server, got {value!r}",
                              param=param)

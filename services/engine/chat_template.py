"""Rendering a conversation with the model's chat template, and the options a request may set on it.

The options are vLLM's chat request fields: ``add_generation_prompt`` (open the assistant's turn; default
on), ``continue_final_message`` (leave the last message open, for the model to continue it: a prefilled
answer) and ``chat_template_kwargs`` (variables the template reads, such as Qwen3's ``enable_thinking``).

Template variables. A kwarg reaches the template only when the template reads a variable of that name (the
template's undeclared variables, found by Jinja's own parser); other names change nothing and are left out,
as vLLM leaves them out, so a client may send ``enable_thinking`` to every model. A name that
``apply_chat_template`` takes as an argument of its own, or that the request sets by another field
(``messages``, ``tools``, ``add_generation_prompt``, …), is refused: it would replace what the request says.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jinja2
import jinja2.meta
import jinja2.sandbox

from services.engine.errors import InvalidRequestError

KWARGS_FIELD = "chat_template_kwargs"
RESERVED_VARIABLES = frozenset({
    "messages", "conversation", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "padding", "truncation", "max_length", "return_tensors", "return_dict",
    "return_assistant_tokens_mask", "tokenizer_kwargs", "sanitize_control_tokens",
})


@dataclass(frozen=True)
class ChatTemplateOptions:
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    kwargs: Mapping[str, Any] = field(default_factory=dict)  # template variables (``chat_template_kwargs``)

    def check(self) -> None:
        """Raise ``InvalidRequestError`` naming the field that cannot be honoured."""
        if self.add_generation_prompt and self.continue_final_message:
            raise InvalidRequestError("continue_final_message", "cannot be true together with add_generation_prompt "
                                                                "(set add_generation_prompt to false)")
        for name in self.kwargs:
            if not isinstance(name, str) or not name.isidentifier():
                raise InvalidRequestError(KWARGS_FIELD, f"{name!r} is not a template variable name")
            if name in RESERVED_VARIABLES:
                raise InvalidRequestError(f"{KWARGS_FIELD}.{name}", "is set by the request itself, not by a "
                                                                    "template variable")


DEFAULT_OPTIONS = ChatTemplateOptions()


@functools.lru_cache(maxsize=8)
def template_variables(source: str) -> frozenset[str]:
    """The variables ``source`` reads that it does not set itself (empty for an unparsable template)."""
    try:
        return frozenset(jinja2.meta.find_undeclared_variables(jinja2.sandbox.ImmutableSandboxedEnvironment()
                                                               .parse(source)))
    except jinja2.TemplateSyntaxError:
        return frozenset()


def render(hf: Any, template: str, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]],
           options: ChatTemplateOptions) -> str:
    """The conversation as text (``hf``: a transformers tokenizer; ``template``: its chat template's source).
    Raises ``InvalidRequestError`` where the template or the options refuse the conversation."""
    options.check()
    used = template_variables(template)
    variables = {name: value for name, value in options.kwargs.items() if name in used}
    try:
        return hf.apply_chat_template(list(messages), tools=[dict(tool) for tool in tools] or None, tokenize=False,
                                      add_generation_prompt=options.add_generation_prompt,
                                      continue_final_message=options.continue_final_message, **variables)
    except jinja2.TemplateError as error:  # e.g. raise_exception("roles must alternate ...")
        raise InvalidRequestError("messages", f"the model's chat template refused them: {error}") from None
    except ValueError as error:  # continue_final_message on a message the template does not write as given
        if options.continue_final_message:
            raise InvalidRequestError("continue_final_message", f"the last message cannot be continued: {error}"
                                      ) from None
        raise


def open_turn(hf: Any, template: str, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]],
              options: ChatTemplateOptions) -> str | None:
    """The text of the turn the model is to write, as far as the prompt has written it: the generation prompt
    (``<|im_start|>assistant\\n``, and Qwen3's ``<think>\\n\\n</think>\\n\\n`` when thinking is off), or with
    ``continue_final_message`` the last message as rendered so far. None when the template does not render
    the conversation before that turn as a prefix of the whole (then nothing is known of the turn)."""
    whole = render(hf, template, messages, tools, options)
    before = messages[:-1] if options.continue_final_message else messages
    if not before:
        return whole
    try:
        head = render(hf, template, before, tools, ChatTemplateOptions(False, False, options.kwargs))
    except InvalidRequestError:  # a template that will not end a conversation there
        return None
    return whole[len(head):] if whole.startswith(head) else None


def closes_reasoning(turn: str, start_marker: str, end_marker: str) -> bool:
    """Does this (open) turn's text end a reasoning section: an end marker after its last start marker, or
    one without a start marker before it (a template that opened the thinking earlier)?"""
    return turn.rfind(end_marker) > turn.rfind(start_marker)

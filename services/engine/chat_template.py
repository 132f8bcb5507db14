"""Rendering a conversation with the model's chat template, and the options a request may set on it.

The options are vLLM's chat request fields: ``add_generation_prompt`` (open the assistant's turn; default
on), ``continue_final_message`` (leave the last message open, for the model to continue it: a prefilled
answer) and ``chat_template_kwargs`` (variables the template reads, such as Qwen3's ``enable_thinking``).

Template variables. A kwarg reaches the template only when the template reads a variable of that name (its
undeclared variables, found by Jinja's parser in transformers' own environment, so templates with
``{% generation %}`` or ``{% break %}`` parse); other names change nothing and are left out, as vLLM leaves
them out, so a client may send ``enable_thinking`` to every model. Refused with the name: an argument of
transformers' ``apply_chat_template`` or of its renderer (``messages``, ``tools``, ``add_generation_prompt``,
``chat_template``, …: the request sets those through its own fields) and a function of the template
environment (``raise_exception``, ``strftime_now``, …). A kwarg may replace a special token's text a template
writes (``bos_token``): that changes the client's own prompt only, as in vLLM. Values are JSON (strings
valid Unicode, at most ``MAX_KWARG_DEPTH`` levels deep; so are the ``tools`` a template renders); a value
the template cannot use is a 400 naming ``chat_template_kwargs``, never an internal error.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import jinja2
import jinja2.meta
from transformers import PreTrainedTokenizerBase
from transformers.utils import chat_template_utils

from services.engine.errors import InvalidRequestError
from services.engine.sampling_params import require_utf8

KWARGS_FIELD = "chat_template_kwargs"
MAX_KWARG_DEPTH = 16
MAX_JSON_DEPTH = 256  # tools' schemas and calls' arguments: any real one, and well inside Python's recursion
MAX_ERROR_CHARS = 200  # of a template's own error text in a refusal (transformers' may hold the whole chat)


def _parameters(function: Any) -> set[str]:
    return {name for name, p in inspect.signature(function).parameters.items()
            if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and name != "self"}


RESERVED_VARIABLES = frozenset({"messages", *_parameters(PreTrainedTokenizerBase.apply_chat_template),
                                *_parameters(chat_template_utils.render_jinja_template)})


@functools.cache
def _environment_globals() -> frozenset[str]:
    return frozenset(chat_template_utils._compile_jinja_template("").environment.globals)


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
        for name, value in self.kwargs.items():
            if not isinstance(name, str) or not name.isidentifier():
                raise InvalidRequestError(KWARGS_FIELD, f"{name!r} is not a template variable name")
            if name in RESERVED_VARIABLES:
                raise InvalidRequestError(f"{KWARGS_FIELD}.{name}", "is set by the request itself, not by a "
                                                                    "template variable")
            if name in _environment_globals():
                raise InvalidRequestError(f"{KWARGS_FIELD}.{name}", "is a function of the template environment")
            _check_value(f"{KWARGS_FIELD}.{name}", value)


def _check_value(where: str, value: Any, depth: int = 0, limit: int = MAX_KWARG_DEPTH) -> None:
    """Refuse JSON whose strings have no UTF-8 form, or that nests past ``limit`` levels."""
    if depth > limit:
        raise InvalidRequestError(where, f"nests more than {limit} levels deep")
    if isinstance(value, str):
        require_utf8(where, value)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            require_utf8(where, str(key))
            _check_value(where, item, depth + 1, limit)
    elif isinstance(value, list | tuple):
        for item in value:
            _check_value(where, item, depth + 1, limit)


DEFAULT_OPTIONS = ChatTemplateOptions(kwargs=MappingProxyType({}))


def is_template_text(given: str) -> bool:
    """``--chat-template``'s value is a template's text, not a file's path (it has Jinja's delimiters)."""
    return "{{" in given or "{%" in given


def template_source(given: str) -> str:
    """``--chat-template``: a Jinja file's path, or a template's text (as vLLM's flag takes either), checked to
    compile. Raises ``ValueError`` naming the flag."""
    if not is_template_text(given):
        try:
            source = Path(given).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise ValueError(f"--chat-template {given}: neither a readable file ({type(error).__name__}) nor a "
                             f"template's text") from None
    else:
        source = given
    try:
        chat_template_utils._compile_jinja_template(source)
    except jinja2.TemplateError as error:
        raise ValueError(f"--chat-template {given[:80]}: not a template transformers can compile: "
                         f"{_short(error)}") from None
    return source


@functools.lru_cache(maxsize=8)
def template_variables(source: str) -> frozenset[str]:
    """The variables ``source`` reads that it neither sets nor has as an environment function (empty for a
    template transformers' environment cannot parse)."""
    try:
        environment = chat_template_utils._compile_jinja_template(source).environment
        return frozenset(jinja2.meta.find_undeclared_variables(environment.parse(source))
                         - set(environment.globals))
    except jinja2.TemplateError:
        return frozenset()


def render(hf: PreTrainedTokenizerBase, template: str, messages: Sequence[Mapping[str, Any]],
           tools: Sequence[Mapping[str, Any]], options: ChatTemplateOptions) -> str:
    """The conversation as text (``hf``: a transformers tokenizer; ``template``: the chat template's source to
    render). Raises ``InvalidRequestError`` where the template or the options refuse the conversation."""
    options.check()
    for i, tool in enumerate(tools):  # the client's JSON, rendered as it is: the tokenizer needs valid Unicode
        _check_value(f"tools[{i}]", tool, limit=MAX_JSON_DEPTH)
    for i, message in enumerate(messages):  # an assistant's calls' arguments too (contents are checked before)
        _check_value(f"messages[{i}]", message, limit=MAX_JSON_DEPTH)
    return _render(hf, template, messages, tools, options)


def _render(hf: PreTrainedTokenizerBase, template: str, messages: Sequence[Mapping[str, Any]],
            tools: Sequence[Mapping[str, Any]], options: ChatTemplateOptions) -> str:
    """:func:`render` of a conversation and options already checked."""
    used = template_variables(template)
    variables = {name: value for name, value in options.kwargs.items() if name in used}
    try:
        return hf.apply_chat_template(list(messages), tools=[dict(tool) for tool in tools] or None, tokenize=False,
                                      chat_template=template, add_generation_prompt=options.add_generation_prompt,
                                      continue_final_message=options.continue_final_message, **variables)
    except jinja2.TemplateError as error:  # e.g. raise_exception("roles must alternate ...")
        raise InvalidRequestError("messages", f"the model's chat template refused them: {_short(error)}") from None
    except (TypeError, ValueError, RecursionError, UnicodeError) as error:
        if variables:  # a value of a type the template cannot use (a number where it slices a string, …)
            raise InvalidRequestError(KWARGS_FIELD, f"the model's chat template could not use them: "
                                                    f"{type(error).__name__}: {_short(error)}") from None
        if options.continue_final_message and isinstance(error, ValueError):
            raise InvalidRequestError("continue_final_message",
                                      f"the last message cannot be continued: {_short(error)}") from None
        raise


def _short(error: BaseException) -> str:
    text = str(error)
    return text if len(text) <= MAX_ERROR_CHARS else f"{text[:MAX_ERROR_CHARS]}…"


def open_turn(hf: PreTrainedTokenizerBase, template: str, messages: Sequence[Mapping[str, Any]],
              tools: Sequence[Mapping[str, Any]], options: ChatTemplateOptions, whole: str | None = None) -> str | None:
    """The text of the turn the model is to write, as far as the prompt has written it: the generation prompt
    (``<|im_start|>assistant\\n``, and Qwen3's ``<think>\\n\\n</think>\\n\\n`` when thinking is off), or with
    ``continue_final_message`` the last message as rendered so far. ``whole``: the conversation as
    :func:`render` gave it (so checked), when the caller has it. None when the template does not render the conversation
    before that turn as a prefix of the whole (then nothing is known of the turn)."""
    whole = render(hf, template, messages, tools, options) if whole is None else whole
    before = messages[:-1] if options.continue_final_message else messages
    if not before:
        return whole
    try:  # the same inputs as ``whole``'s, checked by its rendering
        head = _render(hf, template, before, tools, ChatTemplateOptions(False, False, options.kwargs))
    except InvalidRequestError:  # a template that will not end a conversation there
        return None
    return whole[len(head):] if whole.startswith(head) else None


def closes_reasoning(turn: str, start_marker: str, end_marker: str) -> bool:
    """Does this (open) turn's text end a reasoning section: an end marker after its last start marker, or
    one without a start marker before it (a template that opened the thinking earlier)?"""
    return turn.rfind(end_marker) > turn.rfind(start_marker)


PROMPT_CLOSED, PROMPT_OPENED = "closed", "opened"


def prompt_reasoning(hf: PreTrainedTokenizerBase, template: str, messages: Sequence[Mapping[str, Any]],
                     tools: Sequence[Mapping[str, Any]], options: ChatTemplateOptions, start_marker: str,
                     end_marker: str) -> str:
    """How the turn the model continues (:func:`open_turn`) left the reasoning: :data:`PROMPT_CLOSED` (an end
    marker after its last start marker: the output is all answer), :data:`PROMPT_OPENED` (a start marker after its
    last end marker: the output begins inside the reasoning, as DeepSeek-R1's template and Qwen3's thinking ones
    write ``<think>\n``), or "" (neither). The open turn ends the whole text, so a whole that holds neither marker
    settles the question with one rendering."""
    whole = render(hf, template, messages, tools, options)
    if start_marker not in whole and end_marker not in whole:
        return ""
    turn = open_turn(hf, template, messages, tools, options, whole)
    if turn is None:
        return ""
    if closes_reasoning(turn, start_marker, end_marker):
        return PROMPT_CLOSED
    return PROMPT_OPENED if turn.rfind(start_marker) > turn.rfind(end_marker) else ""

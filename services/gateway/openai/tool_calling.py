"""A chat body's tools → what the request sends: the messages and tools the chat template renders, and the
constraint that forces a call.

- ``tool_choice`` defaults to ``"auto"`` with tools and ``"none"`` without; ``"required"`` or a named
  function need tools (a 400 naming ``tool_choice`` otherwise, and for a name not in ``tools``).
- ``"none"``: the tools are not offered (neither to the template nor in a system block) and the output is
  not parsed for calls. ``"auto"``: offered and parsed; a ``response_format`` / ``guided_*`` may constrain
  the output too (a call is then possible only where that constraint allows it).
- ``"required"`` / named: a Lark grammar of the parser's format forces one call (``parallel_tool_calls``:
  one or more; a named function: exactly one), so the output always parses. Another constraint given too
  is a 400 naming both.
- A template that takes ``tools`` (``Tokenizer.template_takes_tools``) gets them and the messages as they
  are. One that does not (the bundled SmolLM2's) gets the parser's text: its ``tools_prompt`` first in the
  system message (the first message when it is a system one, else a new one), an assistant's calls written
  after its content with ``render_calls``, a tool's result as a user message with ``render_result``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from services.engine.structured_spec import StructuredSpec
from services.engine.tokenizer import ChatMessage, ToolCallRecord
from services.gateway.openai.errors import OpenAIError
from services.gateway.openai.schemas import ChatCompletionBody, ChatMessageBody
from services.gateway.openai.structured import constraint_param, structured_of
from services.gateway.openai.tool_schemas import NamedToolChoice
from services.gateway.openai.tools.grammar import with_special_tokens
from services.gateway.openai.tools.types import EMPTY_PARAMETERS, ParsedToolCall, ToolCallParser, ToolSpec

SYSTEM_ROLES = ("system", "developer")


def _bad(param: str, message: str) -> OpenAIError:
    return OpenAIError(400, f"{param}: {message}", param=param)


@dataclass(frozen=True)
class ToolRequest:
    """``choice``: ``none``, ``auto``, ``required`` or ``named`` (then ``named`` is the function's name)."""

    tools: tuple[ToolSpec, ...] = ()
    choice: str = "none"
    named: str | None = None
    parallel: bool = True

    @property
    def offered(self) -> bool:
        """The tools are offered to the model and its output is read for calls."""
        return bool(self.tools) and self.choice != "none"

    @property
    def forced(self) -> tuple[ToolSpec, ...]:
        """The tools a call is forced among (none: not forced)."""
        if self.choice == "required":
            return self.tools
        return tuple(t for t in self.tools if t.name == self.named) if self.choice == "named" else ()


def tool_request_of(body: ChatCompletionBody) -> ToolRequest:
    """The body's tools and tool choice, checked together (a 400 naming the param)."""
    tools: list[ToolSpec] = []
    for i, tool in enumerate(body.tools or ()):
        function = tool.function
        if any(t.name == function.name for t in tools):
            raise _bad(f"tools[{i}].function.name", f"a second tool named {function.name!r}")
        parameters = function.parameters if function.parameters is not None else dict(EMPTY_PARAMETERS)
        tools.append(ToolSpec(function.name, function.description or "", parameters))
    choice, named = body.tool_choice, None
    if isinstance(choice, NamedToolChoice):
        choice, named = "named", choice.function.name
    choice = choice or ("auto" if tools else "none")
    if choice in ("required", "named") and not tools:
        raise _bad("tool_choice", f"{body.tool_choice!r} needs tools, and the request has none"[:300])
    if named is not None and not any(t.name == named for t in tools):
        raise _bad("tool_choice", f"names the function {named!r}, which is not in tools (have "
                                  f"{', '.join(t.name for t in tools)})"[:300])
    return ToolRequest(tuple(tools), choice, named, body.parallel_tool_calls)


def constraint_of(body: ChatCompletionBody, request: ToolRequest, parser: ToolCallParser) -> StructuredSpec | None:
    """The output constraint: a forced call's grammar, or the body's ``response_format`` / ``guided_*``."""
    given = structured_of(body)
    if not request.forced:
        return given
    if given is not None:
        param = constraint_param(body)
        raise _bad(f"{param}", f"tool_choice {request.choice} and {param} both constrain the output; give "
                               f"one of them")
    try:
        parallel = request.parallel and request.choice == "required"
        grammar = with_special_tokens(parser.forced_grammar(request.forced, parallel=parallel), parser.special_tokens)
    except ValueError as error:  # a format whose calls no grammar here can force (GPT-OSS's harmony)
        raise _bad("tool_choice", str(error)) from None
    return StructuredSpec("grammar", grammar)


def _message(body: ChatMessageBody, i: int) -> ChatMessage:
    if body.tool_calls and body.role != "assistant":
        raise _bad(f"messages[{i}].tool_calls", f"only an assistant's message has tool calls, not a {body.role}'s")
    if body.role == "tool" and not body.tool_call_id:
        raise _bad(f"messages[{i}].tool_call_id", "a tool message names the call it answers")
    if body.reasoning_content is not None and body.role != "assistant":
        raise _bad(f"messages[{i}].reasoning_content", f"only an assistant's message has reasoning, not a "
                                                       f"{body.role}'s")
    calls = tuple(ToolCallRecord(c.id, c.function.name, c.function.arguments) for c in body.tool_calls or ())
    return ChatMessage(body.role, body.text, calls, body.tool_call_id, body.name, body.reasoning_content)


def _names_of_calls(messages: Sequence[ChatMessage]) -> dict[str, str]:
    return {call.id: call.name for m in messages for call in m.tool_calls}


def _as_text(messages: Sequence[ChatMessage], parser: ToolCallParser) -> list[ChatMessage]:
    """Calls and results written in the parser's format, for a template that knows neither."""
    names = _names_of_calls(messages)
    out = []
    for message in messages:
        if message.tool_calls:
            calls = parser.render_calls([ParsedToolCall(c.name, c.arguments) for c in message.tool_calls])
            out.append(ChatMessage(message.role, "\n".join(t for t in (message.content, calls) if t),
                                   reasoning=message.reasoning))
        elif message.role == "tool":
            name = message.name or names.get(message.tool_call_id or "")
            out.append(ChatMessage("user", parser.render_result(message.content, name)))
        else:
            out.append(message)
    return out


def _with_tools_prompt(messages: list[ChatMessage], prompt: str) -> list[ChatMessage]:
    if messages and messages[0].role in SYSTEM_ROLES:
        first = messages[0]
        return [ChatMessage(first.role, f"{prompt}\n\n{first.content}" if first.content else prompt),
                *messages[1:]]
    return [ChatMessage("system", prompt), *messages]


def template_inputs(body: ChatCompletionBody, request: ToolRequest, parser: ToolCallParser | None,
                    template_takes_tools: bool) -> tuple[tuple[ChatMessage, ...], tuple[Mapping[str, Any], ...]]:
    """The messages and the tools (OpenAI dicts) the chat template gets."""
    messages = [_message(m, i) for i, m in enumerate(body.messages)]
    has_tool_turns = any(m.tool_calls or m.role == "tool" for m in messages)
    if parser is None or template_takes_tools:
        tools = tuple(t.openai_dict() for t in request.tools) if request.offered else ()
        return tuple(messages), tools
    if has_tool_turns:
        messages = _as_text(messages, parser)
    if request.offered:
        messages = _with_tools_prompt(messages, parser.tools_prompt(request.tools))
    return tuple(messages), ()

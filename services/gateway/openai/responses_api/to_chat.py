"""A Responses body → the chat completions body it runs as, and the chat front's errors named as the
Responses body has them.

- ``instructions`` → a system message first; ``input`` as a string → one user message.
- ``input`` items: a message (``type: message`` or just ``role``: ``user``, ``system``, ``developer``,
  ``assistant``; content a string or text parts: ``input_text``, ``output_text``, ``refusal``) → that message;
  ``function_call`` → a call of an assistant message (calls right after an assistant message, or after each
  other, join it); ``function_call_output`` → a ``tool`` message answering ``call_id``; ``reasoning`` → the
  ``reasoning_content`` of the next assistant message (its ``content`` texts, else its ``summary``'s).
  Images, files, audio and ``item_reference`` are refused, naming the item.
- ``tools``: ``{"type": "function", "name", "description", "parameters", "strict"}`` → chat's nested shape;
  ``tool_choice`` ``{"type": "function", "name"}`` → chat's; ``text.format`` → ``response_format``;
  ``max_output_tokens`` → ``max_completion_tokens``; ``reasoning.effort`` → the template's ``reasoning_effort``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from services.engine.errors import InvalidRequestError
from services.gateway.openai.errors import OpenAIError, from_gateway, param_of
from services.gateway.openai.responses_api.body import ResponsesBody
from services.gateway.openai.schemas import ChatCompletionBody

MESSAGE_ROLES = ("user", "system", "developer", "assistant")
TEXT_PARTS = {"input_text": "text", "output_text": "text", "text": "text", "refusal": "refusal"}
# the chat body's fields that a Responses body spells otherwise: refused by name, pointing to the Responses field
# (every other undeclared field goes to the chat request as it is)
CHAT_ONLY = {"messages": "input", "max_tokens": "max_output_tokens", "max_completion_tokens": "max_output_tokens",
             "n": "one response per request", "logprobs": "include: [\"message.output_text.logprobs\"]",
             "response_format": "text.format", "reasoning_effort": "reasoning.effort"}


def _bad(param: str, message: str) -> OpenAIError:
    return OpenAIError(400, f"{param}: {message}", param=param)


@dataclass(frozen=True)
class ChatTranslation:
    """The chat body, and where its messages and calls came from: ``origins`` maps ``messages[k]`` and
    ``messages[k].tool_calls[j]`` to ``instructions``, ``input`` or ``input[i]``."""

    body: ChatCompletionBody
    origins: Mapping[str, str]

    def renamed(self, error: OpenAIError | InvalidRequestError) -> OpenAIError:
        return renamed_error(error, self.origins)


def renamed_error(error: OpenAIError | InvalidRequestError, origins: Mapping[str, str]) -> OpenAIError:
    """A chat front's error naming the Responses body's param instead of the chat body's."""
    if isinstance(error, InvalidRequestError):
        error = from_gateway(error)
    detail = error.detail
    new = responses_param(detail.param, origins)
    if new == detail.param or new is None or detail.param is None:
        return error
    message = detail.message
    if message.startswith(detail.param):
        message = new + message[len(detail.param):]
    return OpenAIError(error.status, message, detail.type, new, detail.code)


_MESSAGE = re.compile(r"^messages\[\d+\](\.tool_calls\[\d+\])?")
_TOOL = re.compile(r"^tools\[(\d+)\]\.function")
_IN_CALL = {".function.arguments": ".arguments", ".function.name": ".name", ".id": ".call_id"}
_RENAMED = {"messages": "input", "max_completion_tokens": "max_output_tokens", "max_tokens": "max_output_tokens",
            "response_format.json_schema": "text.format", "response_format": "text.format", "logprobs": "include",
            "top_logprobs": "top_logprobs", "tool_choice.function": "tool_choice", "prompt": "input"}


def responses_param(param: str | None, origins: Mapping[str, str]) -> str | None:
    """``messages[3].content`` → the item message 3 came from (``input[2].content``); a call's
    ``messages[3].tool_calls[1].function.arguments`` → its item's ``arguments``; ``tools[1].function.name`` →
    ``tools[1].name``; ``response_format.json_schema.schema`` → ``text.format.schema``; others as
    :data:`_RENAMED` says."""
    if param is None:
        return None
    if (match := _MESSAGE.match(param)) is not None:
        rest = param[match.end():]
        if match.group(1) is not None:  # a call: its own item
            item = origins.get(match.group(0))
            return item + _IN_CALL.get(rest, "") if item is not None else "input"
        item = origins.get(match.group(0))
        return item + (rest if rest == ".content" else "") if item is not None else "input"
    if (match := _TOOL.match(param)) is not None:
        return f"tools[{match.group(1)}]" + param[match.end():]
    for chat, ours in _RENAMED.items():
        if param == chat or param.startswith(chat + ".") or param.startswith(chat + "["):
            return ours + param[len(chat):]
    return param


def _text(content: Any, param: str) -> str:
    """A message's content: a string, or text parts joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(param, f"expected a string or a list of text parts, got {type(content).__name__}")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        key = TEXT_PARTS.get(kind) if isinstance(kind, str) else None
        if key is None:
            raise _bad(f"{param}[{j}].type", f"only text parts ({', '.join(TEXT_PARTS)}) are supported, got "
                                             f"{kind!r}"[:300])
        if not isinstance(part.get(key), str):
            raise _bad(f"{param}[{j}].{key}", f"expected a string, got {part.get(key)!r}"[:300])
        texts.append(part[key])
    return "".join(texts)


def _string(item: dict[str, Any], key: str, param: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise _bad(f"{param}.{key}", f"expected a non-empty string, got {value!r}"[:300])
    return value


def _reasoning_text(item: dict[str, Any], param: str) -> str:
    parts = item.get("content") or item.get("summary") or []
    if not isinstance(parts, list):
        raise _bad(f"{param}.content", "expected a list of reasoning_text parts")
    texts = [part.get("text") for part in parts if isinstance(part, dict)]
    if not all(isinstance(text, str) for text in texts):
        raise _bad(f"{param}.content", "each part's text must be a string")
    return "\n".join(texts)  # type: ignore[arg-type]


def _messages(body: ResponsesBody) -> tuple[list[dict[str, Any]], dict[str, str]]:
    messages: list[dict[str, Any]] = []
    origins: dict[str, str] = {}

    def add(message: dict[str, Any], origin: str) -> None:
        origins[f"messages[{len(messages)}]"] = origin
        messages.append(message)

    if body.instructions:
        add({"role": "system", "content": body.instructions}, "instructions")
    if isinstance(body.input, str):
        add({"role": "user", "content": body.input}, "input")
        return messages, origins
    reasoning: list[str] = []  # reasoning items' texts, for the assistant turn that follows them
    for i, item in enumerate(body.input):
        param = f"input[{i}]"
        if not isinstance(item, dict):
            raise _bad(param, f"expected an item (an object), got {type(item).__name__}")
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "reasoning":
            reasoning.append(_reasoning_text(item, param))
            continue
        thought = {"reasoning_content": "\n".join(reasoning)} if reasoning else {}
        reasoning = []  # reasoning belongs to the assistant turn right after it, or to none
        if kind == "message":
            role = item.get("role")
            if role not in MESSAGE_ROLES:
                raise _bad(f"{param}.role", f"expected one of {', '.join(MESSAGE_ROLES)}, got {role!r}"[:300])
            content = _text(item.get("content", ""), f"{param}.content")
            add({"role": role, "content": content, **(thought if role == "assistant" else {})}, param)
        elif kind == "function_call":
            call = {"id": _string(item, "call_id", param), "type": "function",
                    "function": {"name": _string(item, "name", param), "arguments": item.get("arguments")}}
            if messages and messages[-1]["role"] == "assistant" and not thought:  # one turn: text, then calls
                calls = messages[-1].setdefault("tool_calls", [])
            else:
                add({"role": "assistant", "content": "", **thought, "tool_calls": []}, param)
                calls = messages[-1]["tool_calls"]
            origins[f"messages[{len(messages) - 1}].tool_calls[{len(calls)}]"] = param
            calls.append(call)
        elif kind == "function_call_output":
            add({"role": "tool", "tool_call_id": _string(item, "call_id", param),
                 "content": _text(item.get("output"), f"{param}.output")}, param)
        else:
            stored = " (this server stores no items to refer to)" if kind == "item_reference" else ""
            raise _bad(f"{param}.type", (f"expected a message, function_call, function_call_output or reasoning "
                                         f"item, got {kind!r}"[:300] + stored))
    return messages, origins


def _tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else tool
            raise _bad(f"tools[{i}].type", f"only function tools are supported, got {kind!r}"[:300])
        out.append({"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}})
    return out


def _tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    if not isinstance(choice, dict):
        return choice
    if choice.get("type") != "function":
        raise _bad("tool_choice.type", f"expected 'function' (or none, auto, required), got "
                                       f"{choice.get('type')!r}"[:300])
    name = choice.get("name")
    if not isinstance(name, str) or not name:
        raise _bad("tool_choice.name", f"expected the name of a function of tools, got {name!r}"[:300])
    return {"type": "function", "function": {"name": name}}


def _response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    if text is None:
        return None
    verbosity = text.get("verbosity")
    if verbosity not in (None, "medium"):
        raise _bad("text.verbosity", f"only 'medium' is supported, got {verbosity!r}"[:300])
    given = text.get("format")
    if given is None:
        return None
    if not isinstance(given, dict):
        raise _bad("text.format", f"expected an object, got {given!r}"[:300])
    if given.get("type") != "json_schema":
        return given
    return {"type": "json_schema", "json_schema": {k: v for k, v in given.items() if k != "type"}}


def chat_body_of(body: ResponsesBody) -> ChatTranslation:
    """The chat completions body ``body`` runs as (a 400 naming the Responses param when it cannot)."""
    extra = dict(body.model_extra or {})
    for name, instead in CHAT_ONLY.items():
        if extra.get(name) is not None:
            raise _bad(name, f"a chat completions field; the Responses API takes {instead}")
    messages, origins = _messages(body)
    template_kwargs = dict(extra.pop("chat_template_kwargs", None) or {})
    if body.reasoning is not None and body.reasoning.effort is not None:
        template_kwargs.setdefault("reasoning_effort", body.reasoning.effort)
    chat: dict[str, Any] = {
        **extra, "model": body.model, "messages": messages, "max_completion_tokens": body.max_output_tokens,
        "temperature": body.temperature, "top_p": body.top_p, "stream": body.stream,
        "parallel_tool_calls": body.parallel_tool_calls, "tools": _tools(body.tools),
        "tool_choice": _tool_choice(body.tool_choice), "response_format": _response_format(body.text),
        "logprobs": body.logprobs, "top_logprobs": body.top_logprobs if body.logprobs else None,
        "chat_template_kwargs": template_kwargs or None}
    try:
        return ChatTranslation(ChatCompletionBody.model_validate(chat), origins)
    except ValidationError as error:
        first = error.errors()[0]
        param = param_of(tuple(first.get("loc", ())))
        message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
        raise renamed_error(OpenAIError(400, f"{param or 'request body'}: {message}", param=param),
                            origins) from None

"""The body of ``POST /v1/messages`` and the chat completions body it runs as.

- ``system`` (a string or text blocks, joined by line breaks as every text of blocks here) → a system message
  first.
- ``messages``: ``user`` / ``assistant`` turns, content a string or blocks. A user's ``tool_result`` blocks
  become ``tool`` messages answering their ``tool_use_id`` (content a string or text blocks; ``is_error``:
  ``Error: `` before it), its ``text`` blocks one user message after them; an assistant's ``text`` blocks its
  content, ``thinking`` blocks its ``reasoning_content``, ``tool_use`` blocks its calls (``input`` as the
  arguments' JSON). ``redacted_thinking`` is dropped; a last ``assistant`` turn is continued (Anthropic's
  prefill: ``continue_final_message``); images, documents and other blocks are refused, naming the block.
- ``tools``: client tools (``{"name", "description", "input_schema"}``, ``type`` absent or ``custom``) → chat's
  function tools; Anthropic's server tools (a ``type`` such as ``web_search_20250305``) are refused.
  ``tool_choice``: ``auto``, ``any`` (chat's ``required``), ``tool`` (named), ``none``;
  ``disable_parallel_tool_use`` → ``parallel_tool_calls: false``.
- ``max_tokens``, ``temperature``, ``top_p``, ``top_k``; ``stop_sequences`` → ``stop`` (the one that matched is
  named in ``stop_sequence``); ``thinking`` ``enabled`` / ``adaptive`` / ``disabled`` → the chat template's
  ``enable_thinking`` (Qwen3's variable; ``budget_tokens`` is not enforced); ``output_config``: ``format`` (a JSON
  schema, Anthropic's structured outputs) → ``response_format`` (the output is constrained to it), ``effort`` → the
  template's ``reasoning_effort`` (``xhigh`` and ``max`` as ``high``); ``metadata`` and ``service_tier`` change
  nothing. Undeclared fields go to the chat request as they are (vLLM's extensions: ``seed``,
  ``min_p``, ``chat_template_kwargs``, …), except the chat body's own spellings (``n``, ``stop``,
  ``max_completion_tokens``, …), refused naming Anthropic's field.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from services.gateway.openai.errors import OpenAIError, param_of
from services.gateway.openai.schemas import ChatCompletionBody, default_of

CHAT_ONLY = {"max_completion_tokens": "max_tokens", "n": "one message per request", "stop": "stop_sequences",
             "logprobs": "nothing (the Messages API has no logprobs)", "response_format": "output_config.format",
             "reasoning_effort": "thinking or output_config.effort"}
EFFORTS = {"low": "low", "medium": "medium", "high": "high", "xhigh": "high", "max": "high"}
UNSUPPORTED = ("container", "mcp_servers", "context_management")
TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}


class NamedError(OpenAIError):
    """A 400 already naming Anthropic's param (not renamed from the chat body's)."""


def _bad(param: str, message: str) -> NamedError:
    return NamedError(400, f"{param}: {message}", param=param)


class MessagesBody(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    model: str | None = None
    max_tokens: int = Field(..., ge=1)
    messages: list[dict[str, Any]] = Field(..., min_length=1)
    system: str | list[dict[str, Any]] | None = None
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None
    output_config: dict[str, Any] | None = None

    @field_validator("*", mode="before")
    @classmethod
    def _null_is_default(cls, value: Any, info: ValidationInfo) -> Any:
        return default_of(cls, value, info)


def _text_of(blocks: Any, param: str) -> str:
    """A string, or text blocks joined."""
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise _bad(param, f"expected a string or a list of content blocks, got {type(blocks).__name__}")
    texts = []
    for j, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind != "text" or not isinstance(block.get("text"), str):
            raise _bad(f"{param}[{j}]", f"only text blocks are supported here, got {kind!r}"[:300])
        texts.append(block["text"])
    return "\n".join(texts)


def _user(content: Any, param: str) -> list[dict[str, Any]]:
    """A user turn: its tool results as tool messages, then its text as one user message."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    if not isinstance(content, list):
        raise _bad(param, f"expected a string or a list of content blocks, got {type(content).__name__}")
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        where = f"{param}[{j}]"
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_result":
            call_id = block.get("tool_use_id")
            if not isinstance(call_id, str) or not call_id:
                raise _bad(f"{where}.tool_use_id", f"expected the id of a tool_use block, got {call_id!r}"[:300])
            result = _text_of(block.get("content", ""), f"{where}.content")
            if block.get("is_error"):  # the model is told the tool failed, as Anthropic's flag tells Claude
                result = f"Error: {result}"
            out.append({"role": "tool", "tool_call_id": call_id, "content": result})
        else:
            raise _bad(f"{where}.type", f"expected a text or tool_result block, got {kind!r} (images, documents and "
                                        f"other blocks are not supported)"[:300])
    if texts or not out:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _assistant(content: Any, param: str) -> dict[str, Any]:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    if not isinstance(content, list):
        raise _bad(param, f"expected a string or a list of content blocks, got {type(content).__name__}")
    texts, thoughts, calls = [], [], []
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        where = f"{param}[{j}]"
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "thinking" and isinstance(block.get("thinking"), str):
            thoughts.append(block["thinking"])
        elif kind == "redacted_thinking":
            continue  # Anthropic's encrypted reasoning: nothing a model here can read
        elif kind == "tool_use":
            name, call_id, arguments = block.get("name"), block.get("id"), block.get("input", {})
            if not isinstance(call_id, str) or not call_id or not isinstance(name, str):
                raise _bad(where, "a tool_use block has an id and a name")
            if not isinstance(arguments, dict):
                raise _bad(f"{where}.input", f"expected an object, got {type(arguments).__name__}")
            calls.append({"id": call_id, "type": "function",
                          "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}})
        else:
            raise _bad(f"{where}.type", f"expected a text, thinking or tool_use block, got {kind!r}"[:300])
    message: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
    if thoughts:
        message["reasoning_content"] = "\n".join(thoughts)
    if calls:
        message["tool_calls"] = calls
    return message


def _tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise _bad(f"tools[{i}]", "expected a tool (an object)")
        if tool.get("type") not in (None, "custom"):
            raise _bad(f"tools[{i}].type", f"Anthropic's server tools are not run here, got {tool.get('type')!r}; "
                                           f"give client tools (name, description, input_schema)"[:300])
        function = {"name": tool.get("name"), "parameters": tool.get("input_schema")}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: dict[str, Any] | None) -> tuple[str | dict[str, Any] | None, bool]:
    """(chat's tool_choice, parallel calls allowed)."""
    if choice is None:
        return None, True
    kind = choice.get("type")
    parallel = not choice.get("disable_parallel_tool_use", False)
    if kind in TOOL_CHOICES:
        return TOOL_CHOICES[kind], parallel
    if kind == "tool":
        name = choice.get("name")
        if not isinstance(name, str) or not name:
            raise _bad("tool_choice.name", f"expected the name of a tool, got {name!r}"[:300])
        return {"type": "function", "function": {"name": name}}, parallel
    raise _bad("tool_choice.type", f"expected auto, any, tool or none, got {kind!r}"[:300])


def _thinking(thinking: dict[str, Any] | None) -> dict[str, Any]:
    if thinking is None:
        return {}
    kind = thinking.get("type")
    if kind not in ("enabled", "adaptive", "disabled"):
        raise _bad("thinking.type", f"expected enabled, adaptive or disabled, got {kind!r}"[:300])
    return {"enable_thinking": kind != "disabled"}


def _output_config(config: dict[str, Any] | None) -> dict[str, Any]:
    """``output_config``'s ``format`` (a JSON schema) → chat's ``response_format``; ``effort`` → the template's
    ``reasoning_effort`` (``xhigh`` and ``max`` as ``high``, the most the templates that read it, GPT-OSS's, know)."""
    if config is None:
        return {}
    unknown = sorted(set(config) - {"format", "effort"})
    if unknown:
        raise _bad(f"output_config.{unknown[0]}", "is not supported by this server")
    chat: dict[str, Any] = {}
    effort = config.get("effort")
    if effort is not None:
        if effort not in EFFORTS:
            raise _bad("output_config.effort", f"expected one of {', '.join(EFFORTS)}, got {effort!r}"[:300])
        chat["reasoning_effort"] = EFFORTS[effort]
    form = config.get("format")
    if form is not None:
        if not isinstance(form, dict) or form.get("type") != "json_schema":
            kind = form.get("type") if isinstance(form, dict) else form
            raise _bad("output_config.format.type", f"expected json_schema, got {kind!r}"[:300])
        if not isinstance(form.get("schema"), dict):
            raise _bad("output_config.format.schema", "expected a JSON schema (an object)")
        chat["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": "output", "schema": form["schema"], "strict": True}}
    return chat


def chat_body_of(body: MessagesBody) -> ChatCompletionBody:
    """The chat completions body ``body`` runs as (a 400 naming Anthropic's param when it cannot)."""
    extra = dict(body.model_extra or {})
    for name, instead in CHAT_ONLY.items():
        if extra.get(name) is not None:
            raise _bad(name, f"a chat completions field; the Messages API takes {instead}")
    for name in UNSUPPORTED:
        if extra.get(name):
            raise _bad(name, "is not supported by this server")
    messages: list[dict[str, Any]] = []
    if body.system:
        messages.append({"role": "system", "content": _text_of(body.system, "system")})
    for i, message in enumerate(body.messages):
        role, content = message.get("role"), message.get("content", "")
        if role == "user":
            messages += _user(content, f"messages[{i}].content")
        elif role == "assistant":
            messages.append(_assistant(content, f"messages[{i}].content"))
        else:
            raise _bad(f"messages[{i}].role", f"expected user or assistant, got {role!r}"[:300])
    template_kwargs = {**_thinking(body.thinking), **dict(extra.pop("chat_template_kwargs", None) or {})}
    tool_choice, parallel = _tool_choice(body.tool_choice)
    chat: dict[str, Any] = {
        **extra, "model": body.model, "messages": messages, "max_tokens": body.max_tokens,
        "temperature": body.temperature, "top_p": body.top_p, "top_k": body.top_k, "stop": body.stop_sequences,
        "stream": body.stream, "tools": _tools(body.tools), "tool_choice": tool_choice,
        "parallel_tool_calls": parallel, "chat_template_kwargs": template_kwargs or None,
        **_output_config(body.output_config)}
    if body.messages[-1].get("role") == "assistant":  # Anthropic's prefill: the reply continues that turn
        chat.update(add_generation_prompt=False, continue_final_message=True)
    try:
        return ChatCompletionBody.model_validate(chat)
    except ValidationError as error:
        first = error.errors()[0]
        param = param_of(tuple(first.get("loc", ())))
        message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
        raise _bad(anthropic_param(param) or "request body", message) from None


def anthropic_param(param: str | None) -> str | None:
    """A chat body's param as Anthropic's body names it (``tools[0].function.parameters`` →
    ``tools[0].input_schema``, ``stop`` → ``stop_sequences``); a message's: ``messages`` (the chat turns need
    not be Anthropic's one for one)."""
    if param is None:
        return None
    if param.startswith("messages"):
        return "messages"
    if param == "stop" or param.startswith("stop["):
        return "stop_sequences"
    if param.startswith("response_format"):  # output_config.format's schema, as chat's response_format holds it
        rest = param[len("response_format"):]
        return "output_config.format" + (rest.replace(".json_schema", "", 1) if rest.startswith(".json_schema")
                                         else rest)
    if param.startswith("tool_choice.function"):
        return "tool_choice" + param[len("tool_choice.function"):]
    if param.startswith("tools[") and ".function" in param:
        head, _, tail = param.partition(".function")
        return head + (".input_schema" + tail[len(".parameters"):] if tail.startswith(".parameters") else tail)
    return param

"""Kimi K2's tool calls (:mod:`.sectioned`; one line, broken here)::

    <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>
    {"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>

The call's id is what the model wrote (``functions.get_weather:0``): Kimi's chat template writes an earlier call back
with its id, so the client's next turn shows the model its own spelling (vLLM returns the same). A block whose id is
not ``[functions.]name:index`` or whose arguments are not one JSON object stays content.
"""

from __future__ import annotations

import re

from services.gateway.openai.tools.grammar import lark_literal
from services.gateway.openai.tools.sectioned import SectionedCallParser, arguments_text, json_arguments
from services.gateway.openai.tools.types import ParsedToolCall, ToolSpec

ARGUMENTS = "<|tool_call_argument_begin|>"
_ID = re.compile(r"\s*((?:functions\.)?([^\s:]+):\d+)\s*")


class KimiK2Parser(SectionedCallParser):
    name = "kimi_k2"
    section_open, section_close = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
    call_open, call_close = "<|tool_call_begin|>", "<|tool_call_end|>"
    extra_markers = (ARGUMENTS,)

    def read_call(self, body: str) -> ParsedToolCall | None:
        head, sep, rest = body.partition(ARGUMENTS)
        match = _ID.fullmatch(head) if sep else None
        arguments = None if match is None else json_arguments(rest)
        if arguments is None:
            return None
        return ParsedToolCall(match.group(2), arguments, call_id=match.group(1))

    def write_call(self, call: ParsedToolCall, index: int) -> str:
        return f"{call.call_id or f'functions.{call.name}:{index}'}{ARGUMENTS}{arguments_text(call)}"

    def call_grammar(self, tool: ToolSpec, arguments: str) -> str:
        return f"{lark_literal('functions.' + tool.name + ':')} /[0-9]+/ {lark_literal(ARGUMENTS)} {arguments}"

    def render_result(self, content: str, name: str | None) -> str:
        return f"## Return of {name or 'the call'}\n{content}"

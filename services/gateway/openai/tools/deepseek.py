"""DeepSeek's tool calls (:mod:`.sectioned`), in two spellings.

``deepseek_v3`` (DeepSeek-V3-0324, R1-0528)::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>

``deepseek_v31`` (DeepSeek-V3.1; one line, broken here)::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜>
    <｜tool▁calls▁end｜>

A block that does not read so (another type than ``function``, arguments that are not one JSON object) stays content.
"""

from __future__ import annotations

import re

from services.gateway.openai.tools.grammar import lark_literal
from services.gateway.openai.tools.sectioned import SectionedCallParser, arguments_text, json_arguments
from services.gateway.openai.tools.types import ParsedToolCall, ToolSpec

SECTION_OPEN, SECTION_CLOSE = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_OPEN, CALL_CLOSE = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"
_V3_CALL = re.compile(r"\s*function" + re.escape(SEP) + r"([^\n]+)\n```json\n(.*)\n```\s*", re.DOTALL)


class _DeepSeekParser(SectionedCallParser):
    section_open, section_close, call_open, call_close = SECTION_OPEN, SECTION_CLOSE, CALL_OPEN, CALL_CLOSE
    extra_markers = (SEP,)

    def render_result(self, content: str, name: str | None) -> str:
        return f"<｜tool▁output▁begin｜>{content}<｜tool▁output▁end｜>"


class DeepSeekV3Parser(_DeepSeekParser):
    name = "deepseek_v3"

    def read_call(self, body: str) -> ParsedToolCall | None:
        match = _V3_CALL.fullmatch(body)
        arguments = None if match is None else json_arguments(match.group(2))
        return None if arguments is None else ParsedToolCall(match.group(1).strip(), arguments)

    def write_call(self, call: ParsedToolCall, index: int) -> str:
        return f"function{SEP}{call.name}\n```json\n{arguments_text(call)}\n```"

    def call_grammar(self, tool: ToolSpec, arguments: str) -> str:
        return f"{lark_literal(f'function{SEP}{tool.name}' + chr(10) + '```json' + chr(10))} {arguments} " \
               f"{lark_literal(chr(10) + '```')}"


class DeepSeekV31Parser(_DeepSeekParser):
    name = "deepseek_v31"

    def read_call(self, body: str) -> ParsedToolCall | None:
        name, sep, rest = body.partition(SEP)
        arguments = json_arguments(rest) if sep and name.strip() else None
        return None if arguments is None else ParsedToolCall(name.strip(), arguments)

    def write_call(self, call: ParsedToolCall, index: int) -> str:
        return f"{call.name}{SEP}{arguments_text(call)}"

    def call_grammar(self, tool: ToolSpec, arguments: str) -> str:
        return f"{lark_literal(tool.name + SEP)} {arguments}"

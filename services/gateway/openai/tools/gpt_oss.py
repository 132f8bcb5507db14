"""GPT-OSS's tool calls, in OpenAI's harmony format (``--tool-call-parser gpt_oss``; vLLM's name ``openai``
too; see :mod:`services.gateway.openai.harmony`)::

    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}

A message to ``functions.NAME`` is a call of NAME when its body is a JSON object, released whole when the
message ends (at ``<|call|>``, usually cut from the output as an end-of-sequence token, so at the end of the
output); one whose body is not an object stays content. The bodies of the other messages (those to a built-in
tool, ``to=python``, included), and text outside any message, are content (with ``--reasoning-parser gpt_oss``
the analysis is taken out before). The chat template of GPT-OSS renders tools, calls and results itself; the
text forms below are for a template without a tool section. A forced call (``tool_choice`` ``required`` or a
named function) is refused: its grammar would have to write harmony's special tokens.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from services.gateway.openai.harmony import (
    CALL,
    CHANNEL,
    CONSTRAIN,
    FUNCTIONS,
    MARKERS,
    MESSAGE,
    START,
    Event,
    HarmonyReader,
)
from services.gateway.openai.tools.scan import (
    ContentEmitter,
    arguments_value,
    collect,
    decode_json,
    hex_call_id,
    skip_space,
)
from services.gateway.openai.tools.types import (
    NO_SPECIAL_TOKENS,
    ParsedOutput,
    ParsedToolCall,
    StreamPiece,
    ToolSpec,
)


def _call(function: str, body: str) -> ParsedToolCall | None:
    found = decode_json(body)
    if found is None or not isinstance(found[0], dict) or skip_space(body, found[1]) != len(body):
        return None
    return ParsedToolCall(function, json.dumps(found[0], ensure_ascii=False))


class HarmonyToolStream:
    def __init__(self) -> None:
        self._reader = HarmonyReader()
        self._content = ContentEmitter()
        self._function: str | None = None
        self._call_text: list[str] = []  # a call's header and body as written, while it is open

    def feed(self, text: str) -> list[StreamPiece]:
        return self._pieces(self._reader.feed(text))

    def finish(self) -> list[StreamPiece]:
        return self._pieces(self._reader.finish())

    def _pieces(self, events: list[Event]) -> list[StreamPiece]:
        pieces: list[StreamPiece] = []
        for event in events:
            if event.kind == "open" and event.header is not None and event.header.function is not None:
                self._function, self._call_text = event.header.function, [event.header.raw]
            elif self._function is not None:
                self._call_text.append(event.text)
                if event.kind == "close":
                    pieces += self._close_call()
            elif event.kind in ("outside", "body"):
                pieces += self._content.emit(event.text)
        return pieces

    def _close_call(self) -> list[StreamPiece]:
        function, written = self._function, self._call_text
        self._function, self._call_text = None, []
        assert function is not None
        body = "".join(written[1:-1])
        call = _call(function, body)
        return [StreamPiece(call=call)] if call is not None else self._content.emit(body)


class GptOssToolParser:
    name = "gpt_oss"
    markers = MARKERS
    special_tokens: Mapping[str, int] = NO_SPECIAL_TOKENS

    def parse(self, text: str, tools: Sequence[ToolSpec] = ()) -> ParsedOutput:
        return collect(self.stream(tools), text)

    def stream(self, tools: Sequence[ToolSpec] = ()) -> HarmonyToolStream:
        return HarmonyToolStream()

    def forced_grammar(self, tools: Sequence[ToolSpec], parallel: bool) -> str:
        raise ValueError("the gpt_oss tool-call parser cannot force a call (its grammar would have to write "
                         "harmony's special tokens); use tool_choice auto")

    def tools_prompt(self, tools: Sequence[ToolSpec]) -> str:
        lines = "\n".join(f"// {tool.description}\ntype {tool.name} = (_: {json.dumps(dict(tool.parameters))}) => any;"
                          for tool in tools)
        return (f"# Tools\n\n## functions\n\nnamespace functions {{\n\n{lines}\n\n}} // namespace functions\n\n"
                "Calls to these tools must go to the commentary channel: 'functions'.")

    def render_calls(self, calls: Sequence[ParsedToolCall]) -> str:
        return "".join(f"{START}assistant{CHANNEL}commentary to={FUNCTIONS}{call.name} {CONSTRAIN}json{MESSAGE}"
                       f"{json.dumps(arguments_value(call.arguments), ensure_ascii=False)}{CALL}" for call in calls)

    def render_result(self, content: str, name: str | None) -> str:
        return f"{START}{FUNCTIONS}{name or 'tool'} to=assistant{CHANNEL}commentary{MESSAGE}{content}"

    def new_call_id(self) -> str:
        return hex_call_id()

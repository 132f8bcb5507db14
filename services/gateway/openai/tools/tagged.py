"""What the parsers of calls written as tagged text (GLM's ``glm.py``, Qwen3-Coder's ``qwen3_coder.py``, MiniMax's
``minimax_m2.py``) share: a call is a ``<tool_call>`` block (MiniMax's: a ``<minimax:tool_call>`` block of calls),
streamed as Hermes' blocks are (:class:`HermesStream`, with the format's own reader of a block, typed by the
request's tools), and a forced call is a Lark grammar of each tool's arguments in its schema's order (the required
ones always), each value with its closing tag: a string as lazy text
(:func:`~services.gateway.openai.tools.schema_values.lazy_text`), an ``enum`` or ``const`` of strings as one of
them, anything else as the format writes it (:meth:`TaggedCallParser.typed_value`)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from services.engine.structured.schema_tools import close_objects
from services.gateway.openai.tools.grammar import lark_literal
from services.gateway.openai.tools.hermes import CLOSE, OPEN, BlockCalls, HermesStream
from services.gateway.openai.tools.scan import collect, hex_call_id
from services.gateway.openai.tools.schema_values import is_string_schema, lazy_text, string_options, text_before_token
from services.gateway.openai.tools.types import NO_SPECIAL_TOKENS, ParsedOutput, ToolSpec


class TaggedCallParser:
    """A format's parser provides :meth:`read_call` and the grammar's pieces; the rest is here."""

    name: str
    markers: tuple[str, ...] = (OPEN, CLOSE)
    special_tokens: Mapping[str, int] = NO_SPECIAL_TOKENS
    block_open, block_close = OPEN, CLOSE  # a block of calls (MiniMax's are its own)
    calls_in_block = False  # parallel calls are invocations in one block (MiniMax's), not blocks
    call_open = OPEN  # what opens a call in the forced grammar
    separator = "\n"  # between parallel calls
    text_rule = "value_text"  # the shared rule of a string value with no bounds
    value_close = ""  # the closing tag after a value, and its regex (``/`` escaped)
    value_close_regex = ""

    def read_call(self, body: str, tools: Sequence[ToolSpec]) -> BlockCalls:
        """The call a block's text between its markers is (its calls, where a block holds several), or None."""
        raise NotImplementedError

    def function_rule(self, tool: ToolSpec, arguments: list[str]) -> str:
        """A call of ``tool`` with the grammar of its ``arguments`` (each an argument rule, maybe with ``?``)."""
        raise NotImplementedError

    def argument_rule(self, key: str, value: str) -> str:
        """One argument ``key`` with ``value`` (a grammar that ends with the value's closing tag)."""
        raise NotImplementedError

    def free_arguments(self) -> str:
        """Any number of arguments of any names (a tool whose parameters list no properties)."""
        raise NotImplementedError

    def typed_value(self, schema: Any, defs: Mapping[str, Any]) -> str:
        """A value of ``schema`` that is not a string, without its closing tag."""
        raise NotImplementedError

    @property
    def _block_close_regex(self) -> str:
        return re.escape(self.block_close).replace("/", "\\/")

    def parse(self, text: str, tools: Sequence[ToolSpec] = ()) -> ParsedOutput:
        return collect(self.stream(tools), text)

    def stream(self, tools: Sequence[ToolSpec] = ()) -> HermesStream:
        return HermesStream(lambda body: self.read_call(body, tools), self.block_open, self.block_close)

    def forced_grammar(self, tools: Sequence[ToolSpec], parallel: bool) -> str:
        if not tools:
            raise ValueError("a forced tool call needs at least one tool")
        more = (f" ({lark_literal(self.separator)} call)*" if self.separator else " call*") if parallel else ""
        alternatives = " | ".join(f"tool_{i}" for i in range(len(tools)))
        open_, close = lark_literal(self.call_open), lark_literal(self.block_close)
        if self.calls_in_block:  # parallel calls are invocations in the one block
            lines = [f"start: {open_} ({alternatives}){'+' if parallel else ''} {close}"]
        else:
            lines = [f"start: call{more}", f"call: {open_} ({alternatives}) {close}"]
        lines += self._text_lines(self.text_rule, None)
        for i, tool in enumerate(tools):
            lines += self._tool_rules(f"tool_{i}", tool)
        return "\n".join(lines) + "\n"

    def _tool_rules(self, rule: str, tool: ToolSpec) -> list[str]:
        parameters = close_objects(dict(tool.parameters))
        defs = {k: parameters[k] for k in ("$defs", "definitions") if k in parameters}
        properties = parameters.get("properties")
        if not isinstance(properties, Mapping):
            return [f"{rule}: {self.function_rule(tool, [self.free_arguments()])}"]
        required = set(parameters.get("required") or ())
        arguments, rules = [], []
        for j, (key, schema) in enumerate(properties.items()):
            value, lines = self._value_rule(schema, defs, f"{rule}_{j}_text")
            rules += [f"{rule}_{j}: {self.argument_rule(key, value)}", *lines]
            arguments.append(f"{rule}_{j}" + ("" if key in required else "?"))
        return [f"{rule}: {self.function_rule(tool, arguments)}", *rules]

    def _value_rule(self, schema: Any, defs: Mapping[str, Any], rule: str) -> tuple[str, list[str]]:
        """One value and its closing tag, and the lines it needs (``rule``: the name of its own rule)."""
        close = lark_literal(self.value_close)
        if isinstance(schema, Mapping) and is_string_schema(schema):
            if strings := string_options(schema):
                return "(" + " | ".join(lark_literal(s) for s in strings) + f") {close}", []
            if schema.get("minLength") or schema.get("maxLength") is not None:
                return rule, self._text_lines(rule, schema)
            return self.text_rule, []
        return f"{self.typed_value(schema, defs)} {close}", []

    def _text_lines(self, rule: str, schema: Mapping[str, Any] | None) -> list[str]:
        """Lines for ``rule``: a string value's text (within ``schema``'s bounds) and its closing tag: lazy text up
        to the tag; where the tag is a special token of the tokenizer, text without it, then the token."""
        if self.value_close in self.special_tokens:
            return [f"{rule}: {rule}_bare {lark_literal(self.value_close)}",
                    *text_before_token(f"{rule}_bare", schema, (self.value_close, self.block_close))]
        return lazy_text(rule, self.value_close_regex, schema, self._block_close_regex)

    def render_result(self, content: str, name: str | None) -> str:
        return f"<tool_response>\n{content}\n</tool_response>"

    def new_call_id(self) -> str:
        return hex_call_id()

"""The front's output parsers, resolved once at startup from ``--tool-call-parser`` and
``--reasoning-parser``: the tool-call parser (``auto``: the family the chat template's source shows), and
the reasoning parser with its end marker's tokens (what a constraint starts after; harmony's tool parser,
which ``auto`` picks for GPT-OSS, brings its reasoning parser where none is named). A reasoning marker
whose pieces are not each one token of the model's vocabulary stops the gateway at startup, naming the flag.
The tool parser learns which of its markers are special tokens of the tokenizer (``special_tokens``), which its
forced grammars then write as those tokens."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from services.engine.tokenizer import Tokenizer
from services.gateway.openai.reasoning.registry import end_token_ids, reasoning_parser
from services.gateway.openai.reasoning.types import ReasoningParser
from services.gateway.openai.tools.registry import tool_call_parser
from services.gateway.openai.tools.types import ToolCallParser

log = logging.getLogger(__name__)
HARMONY = "gpt_oss"  # the parsers of GPT-OSS's harmony format: a tool parser of it brings its reasoning parser


@dataclass(frozen=True)
class FrontParsers:
    tools: ToolCallParser
    template_takes_tools: bool  # the chat template renders ``tools`` (else: the parser's text in a system block)
    reasoning: ReasoningParser | None = None
    reasoning_end_ids: tuple[int, ...] = ()  # the tokens of ``reasoning.end_marker``

    @property
    def reasoning_markers(self) -> tuple[str, str] | None:
        """(start, end) marker texts of the reasoning parser; None without one."""
        return None if self.reasoning is None else (self.reasoning.start_marker, self.reasoning.end_marker)


def _naming(flag: str, value: str, error: ValueError) -> ValueError:
    message = str(error)
    return ValueError(message if flag in message else f"{flag} {value}: {message}")


def resolve_parsers(tool_parser_name: str, reasoning_parser_name: str, tokenizer: Tokenizer) -> FrontParsers:
    """Raises ``ValueError`` naming the flag whose parser cannot serve this model."""
    try:
        tools = tool_call_parser(tool_parser_name, tokenizer.chat_template)
    except ValueError as error:
        raise _naming("--tool-call-parser", tool_parser_name, error) from error
    tokenizer.keep_special_tokens(tools.markers)  # e.g. Mistral's [TOOL_CALLS]: the parser must see it
    tools.special_tokens = special_token_ids(tools.markers, tokenizer)
    if not reasoning_parser_name and tools.name == HARMONY:
        # the harmony markers are kept for the tool parser: without its reasoning parser every answer would show
        # them, and its analysis (as vLLM always reads GPT-OSS's output)
        log.info("harmony output (GPT-OSS): --reasoning-parser gpt_oss with --tool-call-parser gpt_oss")
        reasoning_parser_name = HARMONY
    if not reasoning_parser_name:
        return FrontParsers(tools, tokenizer.template_takes_tools)
    try:
        reasoning = reasoning_parser(reasoning_parser_name)
        end_ids = end_token_ids(reasoning, tokenizer)
    except ValueError as error:
        raise _naming("--reasoning-parser", reasoning_parser_name, error) from error
    tokenizer.keep_special_tokens(reasoning.markers)
    return FrontParsers(tools, tokenizer.template_takes_tools, reasoning, end_ids)


def special_token_ids(markers: Sequence[str], tokenizer: Tokenizer) -> Mapping[str, int]:
    """Those of ``markers`` that are special tokens of ``tokenizer`` (added tokens marked special: Gemma 4's
    ``<|tool_call>``, Mistral's ``[TOOL_CALLS]``; not Qwen's ``<tool_call>``), with their ids."""
    special = {token.content: i for i, token in tokenizer.hf.added_tokens_decoder.items() if token.special}
    return MappingProxyType({marker: special[marker] for marker in markers if marker in special})

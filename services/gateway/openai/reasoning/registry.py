"""The reasoning parsers by the name ``--reasoning-parser`` gives, and the token id their end marker must be
(a constraint applies after it: ``StructuredSpec.starts_after_token_id``)."""

from __future__ import annotations

from collections.abc import Callable

from services.engine.tokenizer import Tokenizer
from services.gateway.openai.reasoning.deepseek_r1 import DeepSeekR1ReasoningParser
from services.gateway.openai.reasoning.qwen3 import Qwen3ReasoningParser
from services.gateway.openai.reasoning.types import ReasoningParser

PARSERS: dict[str, Callable[[], ReasoningParser]] = {
    "qwen3": Qwen3ReasoningParser,
    "deepseek_r1": DeepSeekR1ReasoningParser,
}


def reasoning_parser(name: str) -> ReasoningParser:
    """The parser ``name`` (ValueError naming the choices for any other)."""
    made = PARSERS.get(name)
    if made is None:
        raise ValueError(f"unknown reasoning parser {name!r} (expected one of {', '.join(PARSERS)})")
    return made()


def end_token_id(parser: ReasoningParser, tokenizer: Tokenizer) -> int:
    """The id of ``parser.end_marker`` when the tokenizer writes it as ONE token (an added token such as
    Qwen3's ``</think>``, which encodes whole and decodes back to itself); ValueError otherwise — the
    marker could then be split across tokens and a constraint could not start after it."""
    ids = tokenizer.hf.encode(parser.end_marker, add_special_tokens=False)
    if len(ids) == 1 and tokenizer.decode(ids, skip_special_tokens=False) == parser.end_marker:
        return int(ids[0])
    raise ValueError(f"--reasoning-parser {parser.name} needs {parser.end_marker!r} to be one token of the "
                     "model's vocabulary")

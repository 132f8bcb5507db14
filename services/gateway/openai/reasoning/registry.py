"""The reasoning parsers by the name ``--reasoning-parser`` gives, and the token id their end marker must be
(a constraint applies after them: ``StructuredSpec.starts_after_token_ids``)."""

from __future__ import annotations

import re
from collections.abc import Callable

from services.engine.tokenizer import Tokenizer
from services.gateway.openai.reasoning.deepseek_r1 import (
    DeepSeekR1ReasoningParser,
    MiniMaxM2ReasoningParser,
    SeedOssReasoningParser,
)
from services.gateway.openai.reasoning.gemma4 import Gemma4ReasoningParser
from services.gateway.openai.reasoning.gpt_oss import GptOssReasoningParser
from services.gateway.openai.reasoning.mistral import MistralReasoningParser
from services.gateway.openai.reasoning.qwen3 import Glm45ReasoningParser, Qwen3ReasoningParser
from services.gateway.openai.reasoning.types import ReasoningParser

PARSERS: dict[str, Callable[[], ReasoningParser]] = {
    "qwen3": Qwen3ReasoningParser,
    "deepseek_r1": DeepSeekR1ReasoningParser,
    "gpt_oss": GptOssReasoningParser,
    "openai_gptoss": GptOssReasoningParser,  # vLLM's name for it
    "glm45": Glm45ReasoningParser,
    "minimax_m2": MiniMaxM2ReasoningParser,
    "seed_oss": SeedOssReasoningParser,
    "mistral": MistralReasoningParser,
    "gemma4": Gemma4ReasoningParser,
}


def reasoning_parser(name: str) -> ReasoningParser:
    """The parser ``name`` (ValueError naming the choices for any other)."""
    made = PARSERS.get(name)
    if made is None:
        raise ValueError(f"unknown reasoning parser {name!r} (expected one of {', '.join(PARSERS)})")
    return made()


def end_token_ids(parser: ReasoningParser, tokenizer: Tokenizer) -> tuple[int, ...]:
    """The tokens the model writes ``parser.end_marker`` in: each of its pieces — the parser's markers in it
    and the text between them (GPT-OSS's ``<|channel|>``, ``final``, ``<|message|>``) — ONE token that
    decodes back to it (an added token such as Qwen3's ``</think>``); ValueError otherwise — a piece spelled
    in several tokens could be written in other ones, and a constraint could not start after it."""
    ids = []
    for piece in _pieces(parser.end_marker, parser.markers):
        piece_ids = tokenizer.hf.encode(piece, add_special_tokens=False)
        if len(piece_ids) != 1 or tokenizer.decode(piece_ids, skip_special_tokens=False) != piece:
            what = "" if piece == parser.end_marker else f" (its piece {piece!r})"
            raise ValueError(f"--reasoning-parser {parser.name} needs {parser.end_marker!r}{what} to be one token "
                             "of the model's vocabulary")
        ids.append(int(piece_ids[0]))
    return tuple(ids)


def _pieces(text: str, markers: tuple[str, ...]) -> list[str]:
    """``text`` cut before and after each of ``markers`` in it (empty pieces left out)."""
    pattern = "(" + "|".join(re.escape(m) for m in sorted(markers, key=len, reverse=True)) + ")"
    return [piece for piece in re.split(pattern, text) if piece]

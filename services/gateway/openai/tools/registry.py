"""Choosing the tool-call parser: by name (``--tool-call-parser``), or ``auto`` from the chat template."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from services.gateway.openai.tools.deepseek import DeepSeekV3Parser, DeepSeekV31Parser
from services.gateway.openai.tools.gemma4 import Gemma4Parser
from services.gateway.openai.tools.glm import GlmParser
from services.gateway.openai.tools.gpt_oss import GptOssToolParser
from services.gateway.openai.tools.hermes import HermesParser
from services.gateway.openai.tools.kimi_k2 import KimiK2Parser
from services.gateway.openai.tools.llama3_json import Llama3JsonParser
from services.gateway.openai.tools.minimax_m2 import MiniMaxM2Parser
from services.gateway.openai.tools.mistral import MistralParser
from services.gateway.openai.tools.qwen3_coder import Qwen3CoderParser, SeedOssParser
from services.gateway.openai.tools.types import ToolCallParser

PARSERS: dict[str, Callable[[], ToolCallParser]] = {
    "hermes": HermesParser,
    "llama3_json": Llama3JsonParser,
    "mistral": MistralParser,
    "gpt_oss": GptOssToolParser,
    "openai": GptOssToolParser,  # vLLM's name for it
    "glm45": partial(GlmParser, "glm45", newlines=True),
    "glm47": partial(GlmParser, "glm47", newlines=False),
    "qwen3_coder": Qwen3CoderParser,
    "deepseek_v3": DeepSeekV3Parser,
    "deepseek_v31": DeepSeekV31Parser,
    "kimi_k2": KimiK2Parser,
    "minimax_m2": MiniMaxM2Parser,
    "seed_oss": SeedOssParser,
    "gemma4": Gemma4Parser,
}
CHOICES = ("auto", *PARSERS)
_LLAMA3_HINTS = ("<|python_tag|>", "Environment: ipython", '"parameters"')


def detect_family(chat_template: str) -> str:
    """The family a chat template writes tool calls in: ``[TOOL_CALLS]`` → mistral; harmony's
    ``<|channel|>`` → gpt_oss; GLM's ``<arg_key>`` → glm47 where its pairs are written without newlines
    (``</arg_key><arg_value>``), else glm45; Qwen3-Coder's ``<function=`` and ``<parameter=`` → qwen3_coder;
    ``<tool_call>`` → hermes; DeepSeek's ``<｜tool▁calls▁begin｜>`` → deepseek_v3 where its calls are fenced
    JSON (```` ```json ````), else deepseek_v31; Kimi's ``<|tool_calls_section_begin|>`` → kimi_k2; MiniMax's
    ``<minimax:tool_call>`` → minimax_m2; Seed-OSS's ``<seed:tool_call>`` → seed_oss; Gemma 4's ``<|tool_call>``
    → gemma4;
    ``<|python_tag|>``, Llama 3's ``Environment: ipython`` or a ``"parameters"`` JSON hint → llama3_json; anything
    else (a template with no tool section included) → hermes."""
    if "[TOOL_CALLS]" in chat_template:
        return "mistral"
    if "<|tool_call>" in chat_template:
        return "gemma4"
    if "<minimax:tool_call>" in chat_template:
        return "minimax_m2"
    if "<seed:tool_call>" in chat_template:
        return "seed_oss"
    if "<｜tool▁calls▁begin｜>" in chat_template:
        return "deepseek_v3" if "```json" in chat_template else "deepseek_v31"
    if "<|tool_calls_section_begin|>" in chat_template:
        return "kimi_k2"
    if "<|channel|>" in chat_template:
        return "gpt_oss"
    if "<arg_key>" in chat_template:
        return "glm47" if "</arg_key><arg_value>" in chat_template else "glm45"
    if "<function=" in chat_template and "<parameter=" in chat_template:
        return "qwen3_coder"
    if "<tool_call>" in chat_template:
        return "hermes"
    if any(hint in chat_template for hint in _LLAMA3_HINTS):
        return "llama3_json"
    return "hermes"


def tool_call_parser(name: str, chat_template: str) -> ToolCallParser:
    """The parser ``name`` (one of :data:`CHOICES`) — for ``auto``, the one ``chat_template``'s family
    writes. Raises ValueError naming the choices for an unknown name."""
    if name == "auto":
        name = detect_family(chat_template)
    if name not in PARSERS:
        raise ValueError(f"tool call parser must be one of {', '.join(CHOICES)}, got {name!r}")
    return PARSERS[name]()

"""A tiny random-weight chat model for tool calling and reasoning tests: tiny_families' "qwen3" checkpoint over
the bundled SmolLM2 tokenizer plus Qwen3's six marker tokens (``<think>``, ``</think>``, ``<tool_call>``,
``</tool_call>``, ``<tool_response>``, ``</tool_response>``: added, not special, so they stay in decoded text;
the vocabulary grows by 6 and the model's ``vocab_size`` is the tokenizer's length) and a chat template of
Qwen3's shape, written here: ChatML turns; with ``tools``, a system section listing them in ``<tools>`` and
the ``<tool_call>`` format; an assistant's calls as ``<tool_call>{"name": …, "arguments": …}</tool_call>``;
tool results as a user turn of ``<tool_response>`` blocks; the generation prompt ``<|im_start|>assistant\\n``,
followed by an empty ``<think>\\n\\n</think>\\n\\n`` when ``enable_thinking`` is false (Qwen3's switch).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from transformers import AutoTokenizer

from tests.engine.tiny_families import build_family

MARKERS = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")

CHAT_TEMPLATE = r"""
{%- set has_system = messages and messages[0].role == 'system' -%}
{%- if tools -%}
<|im_start|>system{{ '\n' }}
{%- if has_system %}{{ messages[0].content }}{{ '\n\n' }}{% endif -%}
These functions are at your disposal; each line describes one as JSON:{{ '\n' }}<tools>
{%- for tool in tools %}{{ '\n' }}{{ tool | tojson }}{% endfor -%}
{{ '\n' }}</tools>

To use one, write its name and a JSON object of its arguments between <tool_call> and </tool_call>:
<tool_call>
{"name": "<function name>", "arguments": {"<parameter>": "<value>"}}
</tool_call><|im_end|>{{ '\n' }}
{%- elif has_system -%}
<|im_start|>system{{ '\n' }}{{ messages[0].content }}<|im_end|>{{ '\n' }}
{%- endif -%}
{%- for message in messages -%}
{%- if message.role == 'system' and loop.first -%}
{%- elif message.role == 'assistant' -%}
<|im_start|>assistant{{ '\n' }}{{ message.content or '' }}
{%- for call in message.tool_calls or [] -%}
{%- if not loop.first or message.content %}{{ '\n' }}{% endif -%}
<tool_call>{{ '\n' }}{"name": {{ call.function.name | tojson }}, "arguments": {{ call.function.arguments | tojson }}}
{{- '\n' }}</tool_call>
{%- endfor -%}
<|im_end|>{{ '\n' }}
{%- elif message.role == 'tool' -%}
{%- if loop.first or loop.previtem.role != 'tool' %}<|im_start|>user{% endif -%}
{{ '\n' }}<tool_response>{{ '\n' }}{{ message.content }}{{ '\n' }}</tool_response>
{%- if loop.last or loop.nextitem.role != 'tool' %}<|im_end|>{{ '\n' }}{% endif -%}
{%- else -%}
<|im_start|>{{ message.role }}{{ '\n' }}{{ message.content }}<|im_end|>{{ '\n' }}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt %}<|im_start|>assistant{{ '\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}<think>{{ '\n\n' }}</think>{{ '\n\n' }}{% endif -%}
{%- endif -%}
"""


def chat_tokenizer(bundled_hf):
    """A copy of the bundled tokenizer with the markers added and the template set (the original unchanged)."""
    with tempfile.TemporaryDirectory() as staging:
        bundled_hf.save_pretrained(staging)
        tokenizer = AutoTokenizer.from_pretrained(staging)
    added = tokenizer.add_tokens(list(MARKERS), special_tokens=False)
    assert added == len(MARKERS), added
    tokenizer.chat_template = CHAT_TEMPLATE.strip()
    return tokenizer


def build_chat_family(root: Path, bundled_hf) -> Path:
    """``root/qwen3``: the tiny Qwen3 checkpoint (tiny_families' shape and seed) with the chat tokenizer."""
    return build_family("qwen3", root, chat_tokenizer(bundled_hf))

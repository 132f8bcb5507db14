"""Tool calls written as tagged text (GLM's, Qwen3-Coder's, Kimi K2's) through the HTTP front over fake nodes: a
template in the family's format picks its parser (``auto``), the request's tools type the values it reads (a string
argument that looks like a number stays a string) in whole and streamed answers, a forced choice sends its grammar,
and Kimi's calls keep the ids the model wrote."""

from __future__ import annotations

import json

import pytest

from services.engine.tokenizer import Tokenizer
from services.gateway.openai.tools.glm import GlmParser
from services.gateway.openai.tools.qwen3_coder import Qwen3CoderParser
from services.gateway.openai.tools.types import ToolSpec
from tests.gateway.openai.conftest import MODEL, start_front, stop_front
from tests.gateway.openai.test_openai_front_tools import script_tokens

# GLM-4.5's shape: tools listed in the system turn, calls as key/value pairs on their own lines
GLM_TEMPLATE = (
    "[gMASK]<sop>{% if tools %}<|system|>\n# Tools\n{% for t in tools %}{{ t.function | tojson }}\n{% endfor %}"
    "{% endif %}{% for m in messages %}<|{{ m.role }}|>\n{{ m.content or '' }}{% for c in m.tool_calls or [] %}"
    "\n<tool_call>{{ c.function.name }}\n{% for k, v in c.function.arguments.items() %}<arg_key>{{ k }}</arg_key>\n"
    "<arg_value>{{ v | tojson if v is not string else v }}</arg_value>\n{% endfor %}</tool_call>{% endfor %}"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
           "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER}}]
CHAT = [{"role": "user", "content": "Weather in 10001?"}]
CALL = ("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>10001</arg_value>\n<arg_key>days</arg_key>\n"
        "<arg_value>3</arg_value>\n</tool_call>")


async def _front_with(template: str, model_config):
    """The front over fake nodes, its tokenizer's chat template ``template``."""
    from services.engine.model_files import bundled_model_path

    tokenizer = Tokenizer.load(bundled_model_path(), model_config.eos_token_ids)
    tokenizer.hf.chat_template = template
    running = await start_front(tokenizer, model_config)
    try:
        yield running, tokenizer
    finally:
        await stop_front(running)


@pytest.fixture
async def glm_front(model_config):
    async for front in _front_with(GLM_TEMPLATE, model_config):
        yield front


async def test_a_glm_template_s_calls_are_read_typed_by_the_tools(glm_front):
    front, tokenizer = glm_front
    script_tokens(front, tokenizer, f"Checking.\n{CALL}")
    completion = await front.client.chat.completions.create(model=MODEL, messages=CHAT, tools=TOOLS)
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Checking."
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "10001", "days": 3}  # the schema's string stays one

    script_tokens(front, tokenizer, f"Checking.\n{CALL}\n{CALL.replace('10001', 'Rome')}")
    stream = await front.client.chat.completions.create(model=MODEL, messages=CHAT, tools=TOOLS, stream=True)
    chunks = [chunk async for chunk in stream]
    deltas = [d for c in chunks for d in c.choices[0].delta.tool_calls or ()]
    assert [json.loads(d.function.arguments) for d in deltas] == [{"city": "10001", "days": 3},
                                                                  {"city": "Rome", "days": 3}]
    assert "".join(c.choices[0].delta.content or "" for c in chunks).strip() == "Checking."


async def test_a_forced_call_sends_the_glm_grammar(glm_front):
    front, tokenizer = glm_front
    script_tokens(front, tokenizer, CALL)
    await front.client.chat.completions.create(model=MODEL, messages=CHAT, tools=TOOLS, tool_choice="required",
                                               parallel_tool_calls=False)
    structured = front.cluster.p.requests[0].sampling.structured
    spec = ToolSpec("get_weather", "Weather", WEATHER)
    assert structured.grammar == GlmParser("glm45").forced_grammar([spec], parallel=False)


# Qwen3-Coder's shape: a tag per function and per parameter, values on their own lines
CODER_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n# Tools\n{% for t in tools %}{{ t.function | tojson }}\n{% endfor %}"
    "<|im_end|>\n{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content or '' }}"
    "{% for c in m.tool_calls or [] %}<tool_call>\n<function={{ c.function.name }}>\n"
    "{% for k, v in c.function.arguments.items() %}<parameter={{ k }}>\n{{ v }}\n</parameter>\n{% endfor %}"
    "</function>\n</tool_call>{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CODER_CALL = ("<tool_call>\n<function=get_weather>\n<parameter=city>\n10001\n</parameter>\n<parameter=days>\n3\n"
              "</parameter>\n</function>\n</tool_call>")


@pytest.fixture
async def coder_front(model_config):
    async for front in _front_with(CODER_TEMPLATE, model_config):
        yield front


async def test_a_qwen3_coder_template_s_calls_are_read_typed_by_the_tools(coder_front):
    front, tokenizer = coder_front
    script_tokens(front, tokenizer, f"Checking.\n\n{CODER_CALL}")
    completion = await front.client.chat.completions.create(model=MODEL, messages=CHAT, tools=TOOLS)
    (call,) = completion.choices[0].message.tool_calls
    assert completion.choices[0].message.content == "Checking."
    assert json.loads(call.function.arguments) == {"city": "10001", "days": 3}

    script_tokens(front, tokenizer, f"{CODER_CALL}\n{CODER_CALL.replace('10001', 'Rome')}")
    stream = await front.client.chat.completions.create(model=MODEL, messages=CHAT, tools=TOOLS, stream=True)
    deltas = [d for c in [chunk async for chunk in stream] for d in c.choices[0].delta.tool_calls or ()]
    assert [json.loads(d.function.arguments) for d in deltas] == [{"city": "10001", "days": 3},
                                                                  {"city": "Rome", "days": 3}]

    script_tokens(front, tokenizer, CODER_CALL)
    await front.client.chat.completions.create(model=MODEL, messages=CHAT, tools=TOOLS, tool_choice="required",
                                               parallel_tool_calls=False)
    spec = ToolSpec("get_weather", "Weather", WEATHER)
    assert front.cluster.p.requests[-1].sampling.structured.grammar == \
        Qwen3CoderParser().forced_grammar([spec], parallel=False)


# Kimi K2's shape: calls in a section of special tokens, each with the id the model gives it
KIMI_TEMPLATE = (
    "{% for m in messages %}<|im_{{ m.role }}|>{{ m.content or '' }}{% if m.tool_calls %}"
    "<|tool_calls_section_begin|>{% for c in m.tool_calls %}<|tool_call_begin|>{{ c.id }}<|tool_call_argument_begin|>"
    "{{ c.function.arguments | tojson }}<|tool_call_end|>{% endfor %}<|tool_calls_section_end|>{% endif %}"
    "<|im_end|>{% endfor %}{% if add_generation_prompt %}<|im_assistant|>{% endif %}")
KIMI_CALLS = ('<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>'
              '{"city": "10001"}<|tool_call_end|><|tool_call_begin|>functions.get_weather:1'
              '<|tool_call_argument_begin|>{"city": "Rome", "days": 2}<|tool_call_end|><|tool_calls_section_end|>')


@pytest.fixture
async def kimi_front(model_config):
    async for front in _front_with(KIMI_TEMPLATE, model_config):
        yield front


async def test_a_kimi_template_s_calls_keep_the_ids_the_model_wrote(kimi_front):
    """Kimi's template writes an earlier call back by its id: the answer carries the model's own
    (``functions.get_weather:0``), whole and streamed."""
    front, tokenizer = kimi_front
    script_tokens(front, tokenizer, f"Checking.{KIMI_CALLS}")
    completion = await front.client.chat.completions.create(model=MODEL, messages=CHAT, tools=TOOLS)
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Checking."
    assert [(c.id, json.loads(c.function.arguments)) for c in choice.message.tool_calls] == [
        ("functions.get_weather:0", {"city": "10001"}), ("functions.get_weather:1", {"city": "Rome", "days": 2})]

    script_tokens(front, tokenizer, KIMI_CALLS)
    stream = await front.client.chat.completions.create(model=MODEL, messages=CHAT, tools=TOOLS, stream=True)
    deltas = [d for c in [chunk async for chunk in stream] for d in c.choices[0].delta.tool_calls or ()]
    assert [d.id for d in deltas] == ["functions.get_weather:0", "functions.get_weather:1"]

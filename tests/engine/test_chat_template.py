"""The chat template's options (services/engine/chat_template.py): ``chat_template_kwargs`` reach the template
only as variables it reads, names the request sets otherwise are refused, ``add_generation_prompt`` and
``continue_final_message`` shape the end of the prompt, and ``open_turn`` gives the text of the turn the
model continues (what says whether the prompt already closed the reasoning)."""

from __future__ import annotations

import copy
import functools

import pytest

from services.engine.chat_template import DEFAULT_OPTIONS, ChatTemplateOptions, closes_reasoning, template_variables
from services.engine.errors import InvalidRequestError
from services.engine.tokenizer import ChatMessage, Tokenizer, ToolCallRecord
from tests.engine.tiny_chat_family import chat_tokenizer

HI = [ChatMessage("user", "Hi")]
PREFILLED = [*HI, ChatMessage("assistant", "The answer is")]
NO_THINKING = ChatTemplateOptions(kwargs={"enable_thinking": False})


@pytest.fixture(scope="module")
def qwen3_shaped(bundled_tokenizer) -> Tokenizer:
    """The bundled tokenizer with Qwen3's markers and a template of Qwen3's shape (``enable_thinking``)."""
    return Tokenizer(chat_tokenizer(bundled_tokenizer.hf))


def text(tokenizer: Tokenizer, messages, options: ChatTemplateOptions = DEFAULT_OPTIONS) -> str:
    return tokenizer.hf.decode(tokenizer.apply_chat_template(messages, options=options), skip_special_tokens=False)


def test_enable_thinking_false_closes_an_empty_thinking_in_the_generation_prompt(qwen3_shaped):
    assert text(qwen3_shaped, HI).endswith("<|im_start|>assistant\n")
    assert text(qwen3_shaped, HI, NO_THINKING).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert "enable_thinking" in template_variables(qwen3_shaped.chat_template)


def test_variables_the_template_does_not_read_change_nothing(qwen3_shaped, bundled_tokenizer):
    plain = qwen3_shaped.apply_chat_template(HI)
    assert qwen3_shaped.apply_chat_template(HI, options=ChatTemplateOptions(kwargs={"no_such_variable": 1})) == plain
    # SmolLM2's template has no thinking switch: a client may still send it, as to vLLM
    assert "enable_thinking" not in template_variables(bundled_tokenizer.chat_template)
    assert bundled_tokenizer.apply_chat_template(HI, options=NO_THINKING) == bundled_tokenizer.apply_chat_template(HI)


@pytest.mark.parametrize(("options", "field"), [
    (ChatTemplateOptions(kwargs={"messages": []}), "chat_template_kwargs.messages"),
    (ChatTemplateOptions(kwargs={"add_generation_prompt": False}), "chat_template_kwargs.add_generation_prompt"),
    (ChatTemplateOptions(kwargs={"tools": [{"type": "function"}]}), "chat_template_kwargs.tools"),
    (ChatTemplateOptions(kwargs={"chat_template": "{{ 7 * 7 }}"}), "chat_template_kwargs.chat_template"),
    (ChatTemplateOptions(kwargs={"not a name": 1}), "chat_template_kwargs"),
    (ChatTemplateOptions(add_generation_prompt=True, continue_final_message=True), "continue_final_message"),
])
def test_options_that_cannot_be_honoured_are_refused_naming_the_field(qwen3_shaped, options, field):
    with pytest.raises(InvalidRequestError) as raised:
        qwen3_shaped.apply_chat_template(PREFILLED, options=options)
    assert raised.value.field == field


def test_without_the_generation_prompt_the_prompt_ends_with_the_last_turn(qwen3_shaped):
    without = ChatTemplateOptions(add_generation_prompt=False)
    assert text(qwen3_shaped, HI, without) == "<|im_start|>user\nHi<|im_end|>\n"


def test_continue_final_message_leaves_the_last_message_open(qwen3_shaped):
    options = ChatTemplateOptions(add_generation_prompt=False, continue_final_message=True)
    expected = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nThe answer is"
    assert text(qwen3_shaped, PREFILLED, options) == expected
    assert text(qwen3_shaped, PREFILLED, ChatTemplateOptions(add_generation_prompt=False)).endswith(
        "The answer is<|im_end|>\n")  # without it the turn is closed


def test_open_turn_is_the_text_of_the_turn_the_model_continues(qwen3_shaped):
    assert qwen3_shaped.open_turn(HI) == "<|im_start|>assistant\n"
    assert qwen3_shaped.open_turn(HI, options=NO_THINKING) == "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert qwen3_shaped.open_turn(HI, options=ChatTemplateOptions(add_generation_prompt=False)) == ""
    continued = ChatTemplateOptions(add_generation_prompt=False, continue_final_message=True)
    assert qwen3_shaped.open_turn(PREFILLED, options=continued) == "<|im_start|>assistant\nThe answer is"
    thinking = [*HI, ChatMessage("assistant", "<think>\nLet me see")]
    assert qwen3_shaped.open_turn(thinking, options=continued) == "<|im_start|>assistant\n<think>\nLet me see"


@pytest.mark.parametrize(("turn", "closed"), [
    ("<|im_start|>assistant\n", False),
    ("<|im_start|>assistant\n<think>\n\n</think>\n\n", True),  # Qwen3, thinking off
    ("<|im_start|>assistant\n<think>\n", False),  # DeepSeek-R1's template opens it
    ("<|im_start|>assistant\n<think>\nhmm</think>\n\nThe answer<think>\nagain", False),
    ("</think>\n\nThe answer is", True),  # a template that opened the thinking before the turn
])
def test_closes_reasoning(turn, closed):
    assert closes_reasoning(turn, "<think>", "</think>") is closed


def with_template(tokenizer: Tokenizer, template: str | dict[str, str]) -> Tokenizer:
    hf = copy.deepcopy(tokenizer.hf)
    hf.chat_template = template
    return Tokenizer(hf)


DATED = ("{{ 'Today is ' + date_string + '.\\n' }}{% for m in messages %}{{ m.role }}: {{ m.content }}\\n{% endfor %}"
         "{% if add_generation_prompt %}assistant:{% endif %}")


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"date_string": 5}, "chat_template_kwargs"),  # the template adds it to a string: a TypeError inside
    ({"date_string": "\ud800"}, "chat_template_kwargs.date_string"),  # no UTF-8 form: the tokenizer would fail
    ({"date_string": {"a": ["\ud800"]}}, "chat_template_kwargs.date_string"),
    ({"date_string": functools.reduce(lambda inner, _: [inner], range(40), "x")}, "chat_template_kwargs.date_string"),
    ({"raise_exception": "x"}, "chat_template_kwargs.raise_exception"),  # the environment's functions
    ({"strftime_now": None}, "chat_template_kwargs.strftime_now"),
    ({"documents": []}, "chat_template_kwargs.documents"),
])
def test_a_value_the_template_cannot_use_is_refused_naming_the_field(bundled_tokenizer, kwargs, field):
    dated = with_template(bundled_tokenizer, DATED)
    assert "date_string" in template_variables(dated.chat_template)
    with pytest.raises(InvalidRequestError) as raised:
        dated.apply_chat_template(HI, options=ChatTemplateOptions(kwargs=kwargs))
    assert raised.value.field == field, raised.value
    plain = dated.apply_chat_template(HI, options=ChatTemplateOptions(kwargs={"date_string": "Monday"}))
    assert dated.hf.decode(plain).startswith("Today is Monday.")


def test_templates_with_transformers_extensions_and_named_templates_get_their_variables(qwen3_shaped):
    """``{% generation %}`` (training masks) parses only in transformers' environment; a tokenizer with named
    templates renders ``default`` (or ``tool_use`` with tools) and reads that one's variables."""
    source = qwen3_shaped.chat_template.replace("{{ message.content or '' }}",
                                                "{% generation %}{{ message.content or '' }}{% endgeneration %}")
    assert "{% generation %}" in source
    for tokenizer in (with_template(qwen3_shaped, source), with_template(qwen3_shaped, {"default": source})):
        assert text(tokenizer, HI, NO_THINKING).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
        assert tokenizer.prompt_reasoning(HI, (), NO_THINKING, "<think>", "</think>") == "closed"
        assert tokenizer.prompt_reasoning(HI, (), ChatTemplateOptions(), "<think>", "</think>") == ""
        # a template that opens the thinking in the generation prompt (DeepSeek-R1's, Qwen3's thinking ones)
        prompt = "{%- if add_generation_prompt %}<|im_start|>assistant{{ '\\n' }}"
        assert prompt in source
        opening = with_template(tokenizer, source.replace(prompt, prompt + "<think>{{ '\\n' }}"))
        assert text(opening, HI).endswith("<|im_start|>assistant\n<think>\n")
        assert opening.prompt_reasoning(HI, (), ChatTemplateOptions(), "<think>", "</think>") == "opened"


def test_a_model_without_a_chat_template_refuses_messages_by_name(bundled_tokenizer):
    with pytest.raises(InvalidRequestError) as raised:
        with_template(bundled_tokenizer, None).apply_chat_template(HI)
    assert raised.value.field == "messages" and "no chat template" in raised.value.message


def test_tools_with_text_that_has_no_utf8_form_are_refused_naming_the_tool(qwen3_shaped):
    """A template that renders ``tools`` writes their JSON as it is: a lone surrogate failed the tokenizer
    (an internal error) before."""
    tool = {"type": "function", "function": {"name": "f", "description": "bad \ud800"}}
    with pytest.raises(InvalidRequestError) as raised:
        qwen3_shaped.apply_chat_template(HI, tools=[{"type": "function", "function": {"name": "g"}}, tool])
    assert raised.value.field == "tools[1]"
    call = ToolCallRecord("call_1", "f", '{"city": "\\ud800"}')  # JSON text whose parsed string has no UTF-8 form
    with pytest.raises(InvalidRequestError) as raised:
        qwen3_shaped.apply_chat_template([*HI, ChatMessage("assistant", "", (call,))])
    assert raised.value.field == "messages[1]"
    deep = {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "string"}}}}}
    for _ in range(10):  # a deeply nested schema (40 levels) is still a schema
        deep = {"type": "object", "properties": {"x": deep}}
    assert qwen3_shaped.apply_chat_template(HI, tools=[{"type": "function", "function": {"name": "f",
                                                                                        "parameters": deep}}])

"""The chat template's options through the HTTP front over fake nodes (vLLM's ``add_generation_prompt``,
``continue_final_message``, ``chat_template_kwargs``): the prompt the prefill node gets, ``/tokenize`` the
same, and with a reasoning parser a constraint that starts after ``</think>`` unless the prompt itself
already closed the thinking (Qwen3 with ``enable_thinking`` false), where it applies from the first token."""

from __future__ import annotations

import dataclasses

import pytest

from services.engine.chat_template import ChatTemplateOptions
from services.engine.tokenizer import ChatMessage, Tokenizer
from tests.engine.tiny_chat_family import chat_tokenizer
from tests.gateway.openai.conftest import MODEL, start_front, stop_front
from tests.gateway.openai.test_openai_front_api import script
from tests.gateway.openai.test_openai_front_errors import assert_serving, error_of
from tests.gateway.openai.test_openai_front_tools import prompt_ids

CHAT = [{"role": "user", "content": "Name a colour."}]
PREFILLED = [*CHAT, {"role": "assistant", "content": "My favourite colour is"}]
NO_THINKING = {"enable_thinking": False}


def messages(body: list[dict]) -> list[ChatMessage]:
    return [ChatMessage(m["role"], m["content"]) for m in body]


async def test_the_prefill_node_gets_the_prompt_the_options_render(front, tokenizer):
    cases = [
        ({"add_generation_prompt": False}, CHAT, ChatTemplateOptions(add_generation_prompt=False)),
        ({"add_generation_prompt": False, "continue_final_message": True}, PREFILLED,
         ChatTemplateOptions(add_generation_prompt=False, continue_final_message=True)),
        # SmolLM2's template reads no such variable: the same prompt as without it (as vLLM serves it)
        ({"chat_template_kwargs": NO_THINKING}, CHAT, ChatTemplateOptions()),
        ({"add_generation_prompt": None, "continue_final_message": None, "chat_template_kwargs": None}, CHAT,
         ChatTemplateOptions()),
    ]
    for extra, body, options in cases:
        script(front, tokenizer)
        reply = await front.http.post("/v1/chat/completions", json={"messages": body, **extra})
        assert reply.status_code == 200, reply.text
        expected = tokenizer.apply_chat_template(messages(body), options=options)
        assert prompt_ids(front) == expected, extra
        tokenized = await front.http.post("/tokenize", json={"model": MODEL, "messages": body, **extra})
        assert tokenized.json()["tokens"] == expected
    continued = tokenizer.hf.decode(tokenizer.apply_chat_template(messages(PREFILLED), options=cases[1][2]))
    assert continued.endswith("My favourite colour is")


async def test_the_openai_package_sends_them_as_extra_body(front, tokenizer):
    script(front, tokenizer)
    await front.client.chat.completions.create(model=MODEL, messages=PREFILLED, extra_body={
        "add_generation_prompt": False, "continue_final_message": True, "chat_template_kwargs": NO_THINKING})
    assert prompt_ids(front) == tokenizer.apply_chat_template(messages(PREFILLED), options=ChatTemplateOptions(
        add_generation_prompt=False, continue_final_message=True))


async def test_refused_options_call_no_node(front, tokenizer):
    for extra, param in [({"continue_final_message": True}, "continue_final_message"),
                         ({"chat_template_kwargs": {"add_generation_prompt": False}},
                          "chat_template_kwargs.add_generation_prompt"),
                         ({"chat_template_kwargs": {"1st": True}}, "chat_template_kwargs")]:
        error = error_of(await front.http.post("/v1/chat/completions", json={"messages": PREFILLED, **extra}), 400)
        assert error["param"] == param, error
    assert front.cluster.p.requests == []
    await assert_serving(front, tokenizer)


@pytest.fixture
async def thinking_front(tokenizer, model_config, request):
    """The front over a tokenizer with Qwen3's markers and thinking switch, with --reasoning-parser qwen3 (or
    the parser the test is parametrized with, indirectly)."""
    qwen3_shaped = Tokenizer(chat_tokenizer(tokenizer.hf), model_config.eos_token_ids)
    config = dataclasses.replace(model_config, vocab_size=len(qwen3_shaped.hf))
    running = await start_front(qwen3_shaped, config, reasoning_parser=getattr(request, "param", "qwen3"))
    try:
        yield running, qwen3_shaped
    finally:
        await stop_front(running)


@pytest.mark.parametrize(("extra", "starts_after_end"), [
    ({}, True),
    ({"chat_template_kwargs": {"enable_thinking": True}}, True),
    ({"chat_template_kwargs": NO_THINKING}, False),
])
async def test_a_constraint_applies_from_the_first_token_when_the_prompt_closed_the_thinking(
        thinking_front, extra, starts_after_end):
    front, qwen3_shaped = thinking_front
    end_id = qwen3_shaped.hf.convert_tokens_to_ids("</think>")
    for constraint, n in (({"response_format": {"type": "json_object"}}, 1), ({"guided_choice": ["red", "blue"]}, 1),
                          ({"guided_choice": ["red", "blue"]}, 3)):  # n > 1: the prompt is tokenized once
        script(front, qwen3_shaped, "red")
        reply = await front.http.post("/v1/chat/completions", json={"messages": CHAT, "n": n, **constraint, **extra})
        assert reply.status_code == 200, reply.text
        for request in front.cluster.p.requests[-n:]:
            structured = request.sampling.structured
            assert structured.HasField("starts_after_token_id") is starts_after_end, (extra, constraint, n)
            if starts_after_end:
                assert structured.starts_after_token_id == end_id
                assert list(structured.starts_after_token_ids) == [end_id]


async def test_a_prefilled_answer_after_the_thinking_is_constrained_from_the_first_token(thinking_front):
    """``continue_final_message`` on an assistant message that already closed its thinking: what the model
    writes next is the answer."""
    front, qwen3_shaped = thinking_front
    prefilled = [*CHAT, {"role": "assistant", "content": "<think>\nEasy.\n</think>\n\n"}]
    still_thinking = [*CHAT, {"role": "assistant", "content": "<think>\nLet me"}]
    for body, starts_after_end in ((prefilled, False), (still_thinking, True)):
        script(front, qwen3_shaped, "red")
        reply = await front.http.post("/v1/chat/completions", json={
            "messages": body, "add_generation_prompt": False, "continue_final_message": True,
            "guided_choice": ["red", "blue"]})
        assert reply.status_code == 200, reply.text
        structured = front.cluster.p.requests[-1].sampling.structured
        assert structured.HasField("starts_after_token_id") is starts_after_end, body


@pytest.mark.parametrize("thinking_front", ["deepseek_r1", "qwen3"], indirect=True)
async def test_the_output_of_a_prompt_that_closed_the_thinking_is_all_answer(thinking_front):
    """DeepSeek-R1's parser reads text before any ``</think>`` as reasoning (its template opens the thinking in
    the prompt); when the prompt closed it, the whole output is the answer, for every choice, streamed or not."""
    front, qwen3_shaped = thinking_front
    r1 = front.cluster.gateway.config.reasoning_parser == "deepseek_r1"
    for extra, answer in (({"chat_template_kwargs": NO_THINKING}, True), ({}, not r1)):
        script(front, qwen3_shaped, "red and blue")
        completion = await front.client.chat.completions.create(model=MODEL, messages=CHAT, n=2, extra_body=extra)
        for choice in completion.choices:
            content, reasoning = choice.message.content or "", choice.message.model_extra.get("reasoning_content") or ""
            assert (content, reasoning) == (("red and blue", "") if answer else ("", "red and blue")), extra
        script(front, qwen3_shaped, "red and blue")
        stream = await front.client.chat.completions.create(model=MODEL, messages=CHAT, stream=True, extra_body=extra)
        chunks = [chunk.choices[0].delta async for chunk in stream if chunk.choices]
        content = "".join(d.content or "" for d in chunks)
        reasoning = "".join(d.model_extra.get("reasoning_content") or "" for d in chunks)
        assert (content, reasoning) == (("red and blue", "") if answer else ("", "red and blue")), extra


async def test_the_output_of_a_prompt_that_opened_the_thinking_begins_in_the_reasoning(thinking_front):
    """A prompt whose open turn opened the thinking (an assistant message continued inside it here; DeepSeek-R1's
    and Qwen3's thinking templates end the prompt with ``<think>\\n``): the output is reasoning up to ``</think>``,
    whole and streamed; Qwen3's parser alone would stream what it never saw opened as content."""
    front, qwen3_shaped = thinking_front
    thinking = [*CHAT, {"role": "assistant", "content": "<think>\nLet me"}]
    extra = {"add_generation_prompt": False, "continue_final_message": True}
    script(front, qwen3_shaped, " see.</think>\n\nred")
    completion = await front.client.chat.completions.create(model=MODEL, messages=thinking, extra_body=extra)
    message = completion.choices[0].message
    assert (message.content, message.model_extra.get("reasoning_content")) == ("red", " see.")
    script(front, qwen3_shaped, " see.</think>\n\nred")
    stream = await front.client.chat.completions.create(model=MODEL, messages=thinking, stream=True, extra_body=extra)
    chunks = [chunk.choices[0].delta async for chunk in stream if chunk.choices]
    assert "".join(d.content or "" for d in chunks) == "red"
    assert "".join(d.model_extra.get("reasoning_content") or "" for d in chunks) == " see."


EFFORT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                   "<|im_start|>assistant\nReasoning: {{ reasoning_effort | default('medium') }}\n")


@pytest.fixture
async def effort_front(tokenizer, model_config):
    """The front over a tokenizer whose template reads ``reasoning_effort`` (as GPT-OSS's does)."""
    hf = chat_tokenizer(tokenizer.hf)
    hf.chat_template = EFFORT_TEMPLATE
    shaped = Tokenizer(hf, model_config.eos_token_ids)
    running = await start_front(shaped, dataclasses.replace(model_config, vocab_size=len(hf)))
    try:
        yield running, shaped
    finally:
        await stop_front(running)


async def test_reasoning_effort_reaches_the_template_unless_its_kwargs_set_it(effort_front):
    front, shaped = effort_front
    for extra, effort in (({}, "medium"), ({"reasoning_effort": "high"}, "high"),
                          ({"reasoning_effort": "none"}, "none"),  # Mistral Small 4's instant replies
                          ({"reasoning_effort": "high", "chat_template_kwargs": {"reasoning_effort": "low"}}, "low")):
        script(front, shaped)
        reply = await front.http.post("/v1/chat/completions", json={"messages": CHAT, **extra})
        assert reply.status_code == 200, reply.text
        assert shaped.hf.decode(prompt_ids(front)).endswith(f"Reasoning: {effort}"), extra
        tokenized = await front.http.post("/tokenize", json={"model": MODEL, "messages": CHAT, **extra})
        assert tokenized.json()["tokens"] == prompt_ids(front)
    error = error_of(await front.http.post("/v1/chat/completions", json={"messages": CHAT,
                                                                          "reasoning_effort": "extreme"}), 400)
    assert "reasoning_effort" in error["param"]


ECHO_REASONING = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
                  "{% if m.thinking is defined %} thinking={{ m.thinking }}{% endif %}"
                  "{% if m.reasoning_content is defined %} reasoning_content={{ m.reasoning_content }}{% endif %}"
                  "<|im_end|>\n{% endfor %}<|im_start|>assistant\n")


async def test_an_assistants_reasoning_sent_back_reaches_the_template_under_both_names(effort_front):
    """``reasoning_content`` on an earlier assistant turn: Qwen3's templates read it by that name, GPT-OSS's as
    ``thinking`` (a tool call's analysis); on another role's message it is a 400 naming it."""
    front, shaped = effort_front
    shaped.hf.chat_template = ECHO_REASONING
    turns = [*CHAT, {"role": "assistant", "content": "Red.", "reasoning_content": "Any will do."},
             {"role": "user", "content": "Another?"}]
    script(front, shaped)
    reply = await front.http.post("/v1/chat/completions", json={"messages": turns})
    assert reply.status_code == 200, reply.text
    prompt = shaped.hf.decode(prompt_ids(front))
    assert "Red. thinking=Any will do. reasoning_content=Any will do.<|im_end|>" in prompt
    assert prompt.count("thinking=") == 1  # the other turns have none
    bad = [{"role": "user", "content": "Hi", "reasoning_content": "no"}]
    error = error_of(await front.http.post("/v1/chat/completions", json={"messages": bad}), 400)
    assert error["param"] == "messages[0].reasoning_content"

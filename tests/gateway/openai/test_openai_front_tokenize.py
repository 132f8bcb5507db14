"""``/tokenize`` and ``/detokenize``: the tokens a request would be sent as (text, or chat messages with the
template and generation prompt), and back; bad input is a 400 naming the field; no node is called."""

from __future__ import annotations

from services.engine.tokenizer import ChatMessage
from tests.gateway.openai.conftest import MODEL
from tests.gateway.openai.test_openai_front_errors import error_of


async def test_tokenize_a_prompt_and_messages_as_requests_are_sent_then_detokenize(front, tokenizer):
    reply = await front.http.post("/tokenize", json={"model": MODEL, "prompt": "Hello there",
                                                     "return_token_strs": True})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    ids = tokenizer.encode("Hello there")
    assert (body["tokens"], body["count"]) == (ids, len(ids))
    assert body["max_model_len"] == front.cluster.gateway.core.settings.max_model_len
    assert "".join(body["token_strs"]).replace("Ġ", " ") == "Hello there"

    messages = [{"role": "user", "content": "Say hi"}]
    chat = (await front.http.post("/tokenize", json={"messages": messages})).json()
    assert chat["tokens"] == tokenizer.apply_chat_template([ChatMessage("user", "Say hi")])
    assert chat["token_strs"] is None

    back = await front.http.post("/detokenize", json={"model": MODEL, "tokens": ids})
    assert back.status_code == 200 and back.json() == {"prompt": "Hello there"}
    assert front.cluster.p.requests == []


async def test_bad_tokenize_and_detokenize_input_is_a_400_naming_the_field(front):
    cases = [
        ("/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, "prompt"),
        ("/tokenize", {}, "prompt"),
        ("/tokenize", {"prompt": ""}, "prompt"),
        ("/tokenize", {"messages": [{"role": "wizard", "content": "b"}]}, "messages[0].role"),
        ("/tokenize", {"messages": [{"role": "user", "content": "b"}], "continue_final_message": True},
         "continue_final_message"),
        ("/tokenize", {"messages": [{"role": "user", "content": "b"}], "chat_template_kwargs": {"tools": []}},
         "chat_template_kwargs.tools"),
        ("/detokenize", {"tokens": [1, 10**9]}, "tokens"),
        ("/detokenize", {"tokens": "abc"}, "tokens"),
    ]
    for path, body, param in cases:
        error = error_of(await front.http.post(path, json=body), 400)
        assert error["param"] == param, (path, body, error)
    missing = await front.http.post("/tokenize", json={"model": "other", "prompt": "a"})
    assert error_of(missing, 404)["code"] == "model_not_found"


async def test_a_long_prompt_and_many_messages_tokenize_as_short_ones_do(front, tokenizer):
    """Past ``tokenizing.INLINE_CHARS`` / ``INLINE_MESSAGES`` the work moves to a worker thread; the
    tokens are the same."""
    text = " hello" * 410
    reply = (await front.http.post("/tokenize", json={"prompt": text})).json()
    assert reply["tokens"] == tokenizer.encode(text)
    messages = [ChatMessage("user", "hi"), ChatMessage("assistant", "ho")] * 40
    chat = (await front.http.post("/tokenize", json={"messages": [
        {"role": m.role, "content": m.content} for m in messages]})).json()
    assert chat["tokens"] == tokenizer.apply_chat_template(messages)


async def test_tokenize_renders_tools_and_tool_turns_as_chat_completions_does(front, tokenizer):
    """With ``tools`` and tool-call turns, ``/tokenize`` gives the ids a chat completion sends (the bundled
    template has no tool section: the parser's system block and text, as the request gets them)."""
    from tests.gateway.openai.test_openai_front_api import script

    tools = [{"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}]
    messages = [{"role": "user", "content": "Add one."},
                {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                                      "function": {"name": "add", "arguments": "{\"a\": 1}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "2"}]
    script(front, tokenizer)
    chat = await front.http.post("/v1/chat/completions", json={"model": MODEL, "messages": messages,
                                                               "tools": tools, "max_tokens": 2})
    assert chat.status_code == 200, chat.text
    sent = list(front.cluster.p.requests[-1].prompt_token_ids)
    reply = await front.http.post("/tokenize", json={"model": MODEL, "messages": messages, "tools": tools})
    assert reply.status_code == 200, reply.text
    assert reply.json()["tokens"] == sent
    plain = await front.http.post("/tokenize", json={"model": MODEL, "messages": messages})
    assert plain.json()["tokens"] != sent  # the tools' system block is in the request's prompt
    bad = await front.http.post("/tokenize", json={"model": MODEL, "messages": messages, "tools": tools,
                                                   "tool_choice": {"type": "function", "function": {"name": "x"}}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tool_choice"

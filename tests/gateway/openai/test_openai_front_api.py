"""The HTTP front over fake nodes, through the official ``openai`` client and raw SSE: what each endpoint
answers, and what reaches the nodes."""

from __future__ import annotations

import json

import pytest
from pdserve.v1 import decode_pb2, gateway_pb2

from services.engine.tokenizer import ChatMessage
from tests.gateway.openai.conftest import MODEL, Front

TEXT = " The quick brown fox jumps over the lazy dog."


def script(front: Front, tokenizer, text: str = TEXT, cached_tokens: int = 0) -> list[int]:
    """P answers the first token of ``text``; D the rest in two events, the last with ``length``."""
    ids = tokenizer.encode(text)
    front.cluster.p.first_token, front.cluster.p.cached_tokens = ids[0], cached_tokens

    async def attach(request, context):
        yield decode_pb2.TokenEvent(token_ids=ids[1:4])
        yield decode_pb2.TokenEvent(token_ids=ids[4:], finish_reason="length",
                                    usage=gateway_pb2.Usage(completion_tokens=len(ids)))

    front.cluster.d.script = attach
    return ids


def sse_events(body: str) -> list[str]:
    """The ``data:`` payloads of an SSE body; every event is one ``data:`` line and a blank line."""
    assert body.endswith("\n\n")
    events = body[:-2].split("\n\n")
    assert all(e.startswith("data: ") and "\n" not in e for e in events), body
    return [e.removeprefix("data: ") for e in events]


async def test_models_lists_the_served_model(front):
    listed = await front.client.models.list()
    assert [(m.id, m.object, m.owned_by) for m in listed.data] == [(MODEL, "model", "pdserve")]
    assert listed.data[0].created > 1_600_000_000
    assert (await front.client.models.retrieve(MODEL)).id == MODEL
    health = await front.http.get("/health")
    assert (health.status_code, health.json()) == (200, {"status": "ok"})


async def test_completion_text_usage_and_what_the_nodes_get(front, tokenizer):
    ids = script(front, tokenizer, cached_tokens=16)
    completion = await front.client.completions.create(
        model=MODEL, prompt="Hello there", max_tokens=len(ids), temperature=0.5, top_p=0.9, seed=7,
        stop=["never"], extra_body={"top_k": 5, "stop_token_ids": [2], "ignore_eos": True, "min_tokens": 3},
        user="ignored")

    assert completion.object == "text_completion" and completion.model == MODEL
    assert completion.id.startswith("cmpl-")
    (choice,) = completion.choices
    assert (choice.index, choice.text, choice.finish_reason) == (0, tokenizer.decode(ids), "length")
    prompt_ids = tokenizer.encode("Hello there")
    usage = completion.usage
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (
        len(prompt_ids), len(ids), len(prompt_ids) + len(ids))
    assert usage.prompt_tokens_details.cached_tokens == 16

    sent = front.cluster.p.requests[0]
    assert sent.request_id == completion.id  # the response id is the request id (logs, traces)
    assert list(sent.prompt_token_ids) == prompt_ids
    sampling = sent.sampling
    assert (sampling.max_tokens, sampling.top_k, sampling.seed, list(sampling.stop_token_ids),
            sampling.ignore_eos, sampling.min_tokens) == (len(ids), 5, 7, [2], True, 3)
    assert sampling.temperature == pytest.approx(0.5) and sampling.top_p == pytest.approx(0.9)
    assert list(sampling.stop) == []  # stop strings are matched at the gateway


@pytest.mark.parametrize("prompt", [[1, 2, 3], [[1, 2, 3]]])
async def test_a_prompt_of_token_ids(front, tokenizer, prompt):
    script(front, tokenizer)
    completion = await front.client.completions.create(model=MODEL, prompt=prompt, max_tokens=4)
    assert completion.usage.prompt_tokens == 3
    assert list(front.cluster.p.requests[0].prompt_token_ids) == [1, 2, 3]


async def test_a_stop_string_ends_the_text_before_it(front, tokenizer):
    script(front, tokenizer)
    completion = await front.client.completions.create(model=MODEL, prompt="Hi", stop=" brown")
    assert (completion.choices[0].text, completion.choices[0].finish_reason) == (" The quick", "stop")


async def test_min_tokens_keeps_a_stop_string_in_the_first_tokens_from_matching(front, tokenizer):
    ids = script(front, tokenizer)
    quick = len(tokenizer.encode(" The quick"))
    completion = await front.client.completions.create(model=MODEL, prompt="Hi", stop=" quick",
                                                       max_tokens=len(ids), extra_body={"min_tokens": quick})
    assert (completion.choices[0].text, completion.choices[0].finish_reason) == (tokenizer.decode(ids), "length")


async def test_streamed_completion_chunks_then_usage_then_done(front, tokenizer):
    ids = script(front, tokenizer)
    body = {"model": MODEL, "prompt": "Hello there", "max_tokens": 32, "stream": True,
            "stream_options": {"include_usage": True}}
    reply = await front.http.post("/v1/completions", json=body)
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")

    events = sse_events(reply.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    *text_chunks, usage_chunk = chunks
    assert len({c["id"] for c in chunks}) == 1 and all(c["object"] == "text_completion" for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in text_chunks) == tokenizer.decode(ids)
    assert [c["choices"][0]["finish_reason"] for c in text_chunks] == [None, None, "length"]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["completion_tokens"] == len(ids)


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
async def test_continuous_usage_stats_put_the_usage_so_far_in_every_chunk(front, tokenizer, path):
    """vLLM's ``stream_options.continuous_usage_stats`` (with ``include_usage``): each chunk's usage counts the
    prompt and the tokens up to it (the cached tokens only once known, at the end); then the usage chunk."""
    ids = script(front, tokenizer, cached_tokens=16)
    prompt = {"prompt": "Hello there"} if path == "/v1/completions" else {
        "messages": [{"role": "user", "content": "Hello there"}]}
    body = {**prompt, "max_tokens": 32, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    reply = await front.http.post(path, json=body)
    assert reply.status_code == 200, reply.text
    *chunks, usage_chunk = [json.loads(e) for e in sse_events(reply.text)[:-1]]
    prompt_tokens = len(front.cluster.p.requests[0].prompt_token_ids)
    assert [c["usage"]["prompt_tokens"] for c in chunks] == [prompt_tokens] * len(chunks)
    assert [c["usage"]["completion_tokens"] for c in chunks] == [1, 4, len(ids)]  # the first, then two events
    assert all(c["usage"]["total_tokens"] == prompt_tokens + c["usage"]["completion_tokens"] for c in chunks)
    assert [c["usage"]["prompt_tokens_details"] for c in chunks] == [None, None, {"cached_tokens": 16}]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == len(ids)

    script(front, tokenizer)
    alone = await front.http.post(path, json={**body, "stream_options": {"continuous_usage_stats": True}})
    assert all(json.loads(e)["usage"] is None for e in sse_events(alone.text)[:-1])  # needs include_usage (vLLM)


async def test_streamed_completion_through_the_openai_client(front, tokenizer):
    ids = script(front, tokenizer)
    stream = await front.client.completions.create(model=MODEL, prompt="Hi", max_tokens=32, stream=True)
    chunks = [chunk async for chunk in stream]
    assert "".join(c.choices[0].text for c in chunks) == tokenizer.decode(ids)
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.usage is None for c in chunks)  # no include_usage: no usage chunk


async def test_chat_completion(front, tokenizer):
    ids = script(front, tokenizer)
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Say "}, {"type": "text", "text": "hi"}]}]
    chat = await front.client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=20,
                                                      max_tokens=99)
    assert chat.object == "chat.completion" and chat.id.startswith("chatcmpl-")
    (choice,) = chat.choices
    assert (choice.message.role, choice.message.content, choice.finish_reason) == (
        "assistant", tokenizer.decode(ids), "length")
    templated = tokenizer.apply_chat_template([ChatMessage("system", "Be brief."), ChatMessage("user", "Say hi")])
    assert list(front.cluster.p.requests[0].prompt_token_ids) == templated  # text parts joined
    assert chat.usage.prompt_tokens == len(templated)
    assert front.cluster.p.requests[0].sampling.max_tokens == 20  # max_completion_tokens wins


async def test_a_developer_message_is_a_system_message(front, tokenizer):
    """OpenAI's ``developer`` role (its new name for system instructions) reaches the template as ``system``:
    SmolLM2's template would otherwise put its default system prompt before it."""
    script(front, tokenizer)
    await front.client.chat.completions.create(model=MODEL, max_tokens=5, messages=[
        {"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Say hi"}])
    templated = tokenizer.apply_chat_template([ChatMessage("system", "Be brief."), ChatMessage("user", "Say hi")])
    assert list(front.cluster.p.requests[0].prompt_token_ids) == templated


async def test_streamed_chat_role_first_then_deltas_then_usage(front, tokenizer):
    ids = script(front, tokenizer)
    stream = await front.client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], stream=True,
        stream_options={"include_usage": True})
    chunks = [chunk async for chunk in stream]
    *deltas, last = chunks
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert [c.choices[0].delta.role for c in deltas] == ["assistant", None, None]
    assert "".join(c.choices[0].delta.content or "" for c in deltas) == tokenizer.decode(ids)
    assert deltas[-1].choices[0].finish_reason == "length"
    assert last.choices == [] and last.usage.completion_tokens == len(ids)
    assert last.usage.total_tokens == last.usage.prompt_tokens + len(ids)

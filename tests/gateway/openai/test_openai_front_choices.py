"""``n`` choices through the HTTP front over fake nodes: n requests on the nodes (ids ``<id>-<i>``, seeds
``seed + i``), the choices indexed in the response and in the stream, usage counting the prompt once and
every choice's tokens; a client that leaves aborts every choice. A batch of completions prompts: n choices
of each, prompt by prompt."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict

from tests.gateway.fakes import eventually
from tests.gateway.openai.conftest import MODEL
from tests.gateway.openai.test_openai_front_api import script, sse_events
from tests.gateway.openai.test_openai_front_errors import assert_serving
from tests.gateway.openai.test_openai_front_lifecycle import stall_after_two


async def test_n_completions_are_n_requests_with_indexed_choices(front, tokenizer):
    ids = script(front, tokenizer)
    completion = await front.client.completions.create(model=MODEL, prompt="Hello there", max_tokens=len(ids),
                                                       n=3, seed=40, temperature=0.8)
    assert [c.index for c in completion.choices] == [0, 1, 2]
    assert all(c.text == tokenizer.decode(ids) and c.finish_reason == "length" for c in completion.choices)
    prompt_tokens = len(tokenizer.encode("Hello there"))
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (prompt_tokens, 3 * len(ids))
    sent = sorted(front.cluster.p.requests, key=lambda r: r.request_id)
    assert [r.request_id for r in sent] == [f"{completion.id}-{i}" for i in range(3)]
    assert [r.sampling.seed for r in sent] == [40, 41, 42]
    await front.cluster.gateway.core.wait_background()
    assert front.cluster.gateway.core.in_flight == 0


async def test_each_prompt_is_templated_and_tokenized_once_whatever_n(front, tokenizer, monkeypatch):
    ids = script(front, tokenizer)
    calls = []
    for name in ("encode", "apply_chat_template"):
        real = getattr(tokenizer, name)
        monkeypatch.setattr(tokenizer, name, lambda *args, real=real, name=name, **kwargs: (
            calls.append(name), real(*args, **kwargs))[1])
    messages = [{"role": "user", "content": "Hi"}]
    chat = await front.client.chat.completions.create(model=MODEL, messages=messages, max_tokens=len(ids), n=4)
    assert len(chat.choices) == 4 and calls == ["apply_chat_template"]
    calls.clear()
    batch = await front.client.completions.create(model=MODEL, prompt=["Hello there", "Once upon"], n=3,
                                                  max_tokens=len(ids))
    assert len(batch.choices) == 6 and calls == ["encode", "encode"]
    sent = {r.request_id: list(r.prompt_token_ids) for r in front.cluster.p.requests}
    assert sent[f"{batch.id}-5"] == tokenizer.encode("Once upon")  # what the prompt's text tokenizes to
    await front.cluster.gateway.core.wait_background()


async def test_a_batch_of_prompts_is_n_choices_of_each_prompt_by_prompt(front, tokenizer):
    ids = script(front, tokenizer)
    token_prompt = tokenizer.encode("Once upon a time")
    completion = await front.client.completions.create(model=MODEL, prompt=["Hello there", token_prompt],
                                                       max_tokens=len(ids), n=2, seed=40, temperature=0.8)
    assert [c.index for c in completion.choices] == [0, 1, 2, 3]
    assert all(c.text == tokenizer.decode(ids) for c in completion.choices)
    prompt_tokens = len(tokenizer.encode("Hello there")) + len(token_prompt)  # each prompt once
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (prompt_tokens, 4 * len(ids))
    sent = {r.request_id: r for r in front.cluster.p.requests}
    assert sorted(sent) == [f"{completion.id}-{k}" for k in range(4)]
    assert [sent[f"{completion.id}-{k}"].sampling.seed for k in range(4)] == [40, 41, 40, 41]
    prompts = [list(sent[f"{completion.id}-{k}"].prompt_token_ids) for k in range(4)]
    assert prompts == [tokenizer.encode("Hello there")] * 2 + [token_prompt] * 2

    stream = await front.client.completions.create(model=MODEL, prompt=["a", "b", "c"], max_tokens=len(ids),
                                                   stream=True, stream_options={"include_usage": True})
    texts: dict[int, str] = defaultdict(str)
    chunks = [chunk async for chunk in stream]
    for chunk in chunks[:-1]:
        texts[chunk.choices[0].index] += chunk.choices[0].text
    assert dict(texts) == {i: tokenizer.decode(ids) for i in range(3)}
    assert chunks[-1].usage.prompt_tokens == 3 * len(tokenizer.encode("a"))
    await front.cluster.gateway.core.wait_background()
    assert front.cluster.gateway.core.in_flight == 0


async def test_n_chat_choices_stream_with_their_index_and_usage_at_the_end(front, tokenizer):
    ids = script(front, tokenizer)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": len(ids), "n": 2,
            "stream": True, "stream_options": {"include_usage": True}}
    reply = await front.http.post("/v1/chat/completions", json=body)
    assert reply.status_code == 200, reply.text
    *chunks, done = sse_events(reply.text)
    assert done == "[DONE]"
    *choice_chunks, usage_chunk = [json.loads(c) for c in chunks]
    texts, roles, finishes = defaultdict(str), defaultdict(list), {}
    for chunk in choice_chunks:
        (choice,) = chunk["choices"]
        texts[choice["index"]] += choice["delta"].get("content", "")
        roles[choice["index"]] += [choice["delta"]["role"]] if "role" in choice["delta"] else []
        if choice["finish_reason"]:
            finishes[choice["index"]] = choice["finish_reason"]
    assert dict(texts) == {0: tokenizer.decode(ids), 1: tokenizer.decode(ids)}
    assert dict(roles) == {0: ["assistant"], 1: ["assistant"]} and finishes == {0: "length", 1: "length"}
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 2 * len(ids)


async def test_a_client_leaving_aborts_every_choice(front, tokenizer):
    stall_after_two(front, tokenizer)
    waiting = asyncio.ensure_future(front.http.post("/v1/completions", json={"prompt": "Hi", "n": 3}))
    await eventually(lambda: len(front.cluster.d.attaches) == 3, what="three requests on the decode node")
    waiting.cancel()  # closes the connection
    await eventually(lambda: sorted(front.cluster.d.aborts) == sorted(front.cluster.d.attaches),
                     what="every choice aborted on the decode node")
    await eventually(lambda: front.cluster.gateway.core.in_flight == 0, what="every flow closed")
    await assert_serving(front, tokenizer)


async def test_a_client_leaving_a_stream_of_choices_aborts_every_choice(front, tokenizer):
    stall_after_two(front, tokenizer)
    async with front.http.stream("POST", "/v1/completions", json={"prompt": "Hi", "n": 2, "stream": True}) as reply:
        events: list[str] = []  # each choice's first token, then their decode nodes' first tokens
        async for line in reply.aiter_lines():
            events += [line] if line else []
            if len(events) == 4:
                break
    await eventually(lambda: len(front.cluster.d.aborts) == 2, what="both choices aborted on the decode node")
    assert sorted(front.cluster.d.aborts) == sorted(front.cluster.d.attaches)
    await eventually(lambda: front.cluster.gateway.core.in_flight == 0, what="every flow closed")
    await assert_serving(front, tokenizer)


async def test_a_bad_prompt_in_a_batch_is_named_and_no_prompt_is_sent(front, tokenizer):
    reply = await front.http.post("/v1/completions", json={"prompt": ["Hi", "there", ""], "n": 2})
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["param"] == "prompt" and error["message"] == "prompt: prompt 2 of the batch: is empty", error
    assert front.cluster.p.requests == [] and front.cluster.gateway.core.in_flight == 0

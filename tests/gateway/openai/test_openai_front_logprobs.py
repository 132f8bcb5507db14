"""Logprobs through the HTTP front over fake nodes: what the nodes send per token comes out in OpenAI's
completions shape (tokens, token_logprobs, top_logprobs, text_offset) and chat shape (content entries with
bytes and top_logprobs), streamed and not, cut with the text at a stop string; the nodes are asked for k."""

from __future__ import annotations

import json

import pytest
from pdserve.v1 import decode_pb2, gateway_pb2

from tests.gateway.openai.conftest import MODEL
from tests.gateway.openai.test_openai_front_api import TEXT, sse_events

OTHER = 5  # the runner-up of every token in this script


def logprob(token_id: int, i: int) -> gateway_pb2.TokenLogprob:
    value = -0.25 * (i + 1)
    return gateway_pb2.TokenLogprob(token_id=token_id, logprob=value, top=[
        gateway_pb2.TopLogprob(token_id=token_id, logprob=value), gateway_pb2.TopLogprob(token_id=OTHER, logprob=-9)])


def script_logprobs(front, tokenizer, text: str = TEXT) -> list[int]:
    ids = tokenizer.encode(text)
    front.cluster.p.first_token, front.cluster.p.first_logprob = ids[0], logprob(ids[0], 0)

    async def attach(request, context):
        yield decode_pb2.TokenEvent(token_ids=ids[1:4], logprobs=[logprob(t, i) for i, t in enumerate(ids[1:4], 1)])
        yield decode_pb2.TokenEvent(token_ids=ids[4:], finish_reason="length",
                                    usage=gateway_pb2.Usage(completion_tokens=len(ids)),
                                    logprobs=[logprob(t, i) for i, t in enumerate(ids[4:], 4)])

    front.cluster.d.script = attach
    return ids


def texts(tokenizer, ids: list[int]) -> list[str]:
    return [tokenizer.decode([t], skip_special_tokens=False) for t in ids]


@pytest.mark.parametrize("stream", [False, True])
async def test_completion_logprobs_in_the_legacy_shape(front, tokenizer, stream):
    ids = script_logprobs(front, tokenizer)
    reply = await front.http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": len(ids), "logprobs": 1,
                                                           "stream": stream})
    assert reply.status_code == 200, reply.text
    choices = [json.loads(e)["choices"][0] for e in sse_events(reply.text)[:-1]] if stream \
        else reply.json()["choices"]
    tokens = [t for c in choices if c["logprobs"] for t in c["logprobs"]["tokens"]]
    values = [v for c in choices if c["logprobs"] for v in c["logprobs"]["token_logprobs"]]
    tops = [d for c in choices if c["logprobs"] for d in c["logprobs"]["top_logprobs"]]
    offsets = [o for c in choices if c["logprobs"] for o in c["logprobs"]["text_offset"]]
    assert tokens == texts(tokenizer, ids)
    assert values == pytest.approx([-0.25 * (i + 1) for i in range(len(ids))])
    assert tops[0] == {tokens[0]: pytest.approx(-0.25), texts(tokenizer, [OTHER])[0]: pytest.approx(-9)}
    assert offsets == [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
    assert front.cluster.p.requests[0].sampling.logprobs == 1
    assert front.cluster.p.requests[0].sampling.HasField("logprobs")


async def test_chat_logprobs_with_bytes_and_top_logprobs(front, tokenizer):
    ids = script_logprobs(front, tokenizer)
    completion = await front.client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=len(ids), logprobs=True,
        top_logprobs=2)
    content = completion.choices[0].logprobs.content
    assert [c.token for c in content] == texts(tokenizer, ids)
    assert [c.bytes for c in content] == [list(t.encode()) for t in texts(tokenizer, ids)]
    assert [c.logprob for c in content] == pytest.approx([-0.25 * (i + 1) for i in range(len(ids))])
    assert [t.token for t in content[0].top_logprobs] == texts(tokenizer, [ids[0], OTHER])
    assert front.cluster.p.requests[0].sampling.logprobs == 2


SPLIT = "日本🎌 ok"  # 日 and 🎌 are each split over several byte-level tokens


async def test_the_bytes_of_tokens_that_split_a_character_join_back_into_it(front, tokenizer):
    ids = script_logprobs(front, tokenizer, SPLIT)
    assert "\ufffd" in texts(tokenizer, ids)  # the script does split characters
    completion = await front.client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=len(ids), logprobs=True,
        top_logprobs=1)
    content = completion.choices[0].logprobs.content
    assert completion.choices[0].message.content == SPLIT
    assert b"".join(bytes(c.bytes) for c in content).decode() == SPLIT
    assert [bytes(c.top_logprobs[0].bytes) for c in content] == [bytes(c.bytes) for c in content]  # itself
    for added in tokenizer.hf.added_tokens_decoder:  # added tokens are plain text, not byte-level spellings
        assert tokenizer.token_bytes(added) == tokenizer.decode([added], skip_special_tokens=False).encode()


async def test_text_offsets_of_split_characters_stay_in_the_text(front, tokenizer):
    ids = script_logprobs(front, tokenizer, SPLIT)
    reply = await front.http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": len(ids), "logprobs": 0})
    choice = reply.json()["choices"][0]
    pieces = [tokenizer.token_bytes(t) for t in ids]
    # a token's offset: the characters its predecessors' bytes complete
    expected = [len(b"".join(pieces[:i]).decode(errors="ignore")) for i in range(len(ids))]
    assert choice["text"] == SPLIT and choice["logprobs"]["text_offset"] == expected
    assert max(expected) < len(SPLIT) and len(set(expected)) < len(expected)  # shared offsets, none past the end


async def test_no_logprobs_unless_asked_and_none_past_a_stop_string(front, tokenizer):
    ids = script_logprobs(front, tokenizer)
    plain = await front.client.completions.create(model=MODEL, prompt="Hi", max_tokens=len(ids))
    assert plain.choices[0].logprobs is None
    assert not front.cluster.p.requests[0].sampling.HasField("logprobs")
    script_logprobs(front, tokenizer)
    cut = await front.client.completions.create(model=MODEL, prompt="Hi", max_tokens=len(ids), stop=" brown",
                                                logprobs=0)
    kept = len(tokenizer.encode(" The quick brown"))  # up to the token that completed the stop string
    assert cut.choices[0].text == " The quick" and len(cut.choices[0].logprobs.tokens) == kept


@pytest.mark.parametrize("stream", [False, True])
async def test_return_tokens_as_token_ids_names_each_token_by_its_id(front, tokenizer, stream):
    """vLLM's ``return_tokens_as_token_ids``: ``token_id:<id>`` wherever a token's text would be (the sampled
    token and its alternatives, in both shapes, echoed prompts too); the text, offsets and bytes stay the same."""
    ids = script_logprobs(front, tokenizer)
    named = [f"token_id:{t}" for t in ids]
    body = {"prompt": "Hi", "max_tokens": len(ids), "logprobs": 1, "stream": stream,
            "return_tokens_as_token_ids": True}
    reply = await front.http.post("/v1/completions", json=body)
    assert reply.status_code == 200, reply.text
    choices = [json.loads(e)["choices"][0] for e in sse_events(reply.text)[:-1]] if stream \
        else reply.json()["choices"]
    shown = [c["logprobs"] for c in choices if c["logprobs"]]
    assert [t for lp in shown for t in lp["tokens"]] == named
    assert shown[0]["top_logprobs"][0] == {named[0]: pytest.approx(-0.25), f"token_id:{OTHER}": pytest.approx(-9)}
    text = texts(tokenizer, ids)
    assert [o for lp in shown for o in lp["text_offset"]] == [sum(len(t) for t in text[:i]) for i in range(len(ids))]
    assert "".join(c["text"] for c in choices) == tokenizer.decode(ids)

    script_logprobs(front, tokenizer)
    chat = await front.http.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "Hi"}], "max_tokens": len(ids), "logprobs": True,
        "top_logprobs": 1, "return_tokens_as_token_ids": True})
    assert chat.status_code == 200, chat.text
    content = chat.json()["choices"][0]["logprobs"]["content"]
    assert [c["token"] for c in content] == named
    assert [c["top_logprobs"][1]["token"] for c in content] == [f"token_id:{OTHER}"] * len(ids)
    assert content[0]["bytes"] == list(tokenizer.token_bytes(ids[0]))  # the token's own bytes


async def test_return_tokens_as_token_ids_names_the_echoed_prompt_s_tokens_too(front, tokenizer):
    ids = script_logprobs(front, tokenizer)
    prompt = tokenizer.encode("Hello there")
    front.cluster.p.prompt_logprobs = [logprob(t, i) for i, t in enumerate(prompt[1:])]
    reply = await front.http.post("/v1/completions", json={
        "prompt": "Hello there", "max_tokens": len(ids), "logprobs": 1, "echo": True, "prompt_logprobs": 1,
        "return_tokens_as_token_ids": True})
    assert reply.status_code == 200, reply.text
    (choice,) = reply.json()["choices"]
    assert choice["logprobs"]["tokens"] == [f"token_id:{t}" for t in [*prompt, *ids]]
    assert choice["prompt_logprobs"][1][str(prompt[1])]["decoded_token"] == f"token_id:{prompt[1]}"
    assert choice["text"].startswith("Hello there")

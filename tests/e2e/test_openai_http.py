"""The gateway's OpenAI-compatible HTTP front on the session's live cluster (real processes, the real model,
float32 greedy), through the official ``openai`` package: the text equals what gRPC ``Generate`` returns for the
same request, usage is right, bad input gets OpenAI-style 4xx errors, and afterwards the gateway serves and
no block is held anywhere."""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest
import torch
from pdserve.v1 import gateway_pb2

from tests.e2e.conftest import generate, greedy, wait_idle

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
PROMPT = "The capital of France is"
CHAT = [{"role": "user", "content": "Name three colours."}]
NEW_TOKENS = 12
GREEDY = {"temperature": 0.0, "max_tokens": NEW_TOKENS, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def client(cluster):
    assert cluster.http_url.startswith("http://127.0.0.1:")
    with openai.OpenAI(base_url=f"{cluster.http_url}/v1", api_key="unused", max_retries=0, timeout=120) as made:
        yield made


def test_models_lists_the_bundled_model(client):
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_completions_match_grpc_generate(client, stub, bundled_tokenizer):
    tokens, text, last = generate(stub, prompt=PROMPT, sampling=greedy(NEW_TOKENS))
    assert len(tokens) == NEW_TOKENS and text

    completion = client.completions.create(model=MODEL, prompt=PROMPT, **GREEDY)
    assert completion.choices[0].text == text and completion.choices[0].finish_reason == "length"
    usage = completion.usage
    prompt_tokens = len(bundled_tokenizer.encode(PROMPT))
    assert last.usage.prompt_tokens == prompt_tokens
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (
        prompt_tokens, NEW_TOKENS, prompt_tokens + NEW_TOKENS)
    assert usage.prompt_tokens_details.cached_tokens >= 0

    stream = client.completions.create(model=MODEL, prompt=PROMPT, stream=True,
                                       stream_options={"include_usage": True}, **GREEDY)
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == NEW_TOKENS
    as_ids = client.completions.create(model=MODEL, prompt=bundled_tokenizer.encode(PROMPT), **GREEDY)
    assert as_ids.choices[0].text == text


def test_a_stop_string_stays_in_the_text_with_include_stop_str_in_output(client, stub):
    _, text, _ = generate(stub, prompt=PROMPT, sampling=greedy(NEW_TOKENS))
    words = text.split()
    stop = f" {words[len(words) // 2]}"  # a word in the middle of the greedy text
    assert stop in text
    before = text[:text.index(stop)]
    cut = client.completions.create(model=MODEL, prompt=PROMPT, stop=[stop], **GREEDY).choices[0]
    kept = client.completions.create(model=MODEL, prompt=PROMPT, stop=[stop], **{
        **GREEDY, "extra_body": {**GREEDY["extra_body"], "include_stop_str_in_output": True}}).choices[0]
    assert (cut.text, cut.finish_reason) == (before, "stop")
    assert (kept.text, kept.finish_reason) == (before + stop, "stop")


def test_echo_and_prompt_logprobs_are_transformers_log_softmax_of_the_prompt(client, stub, bundled_tokenizer,
                                                                              hf_bundled_model):
    ids = bundled_tokenizer.encode(PROMPT)
    with torch.inference_mode():
        reference = torch.log_softmax(hf_bundled_model(input_ids=torch.tensor([ids])).logits[0].float(), dim=-1)
    client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1)  # the prompt is in the prefix cache now
    echoed = client.completions.create(model=MODEL, prompt=PROMPT, echo=True, logprobs=2, **GREEDY)
    choice, lists = echoed.choices[0], echoed.choices[0].logprobs
    assert choice.text.startswith(PROMPT) and len(choice.text) > len(PROMPT)
    assert lists.token_logprobs[0] is None and lists.top_logprobs[0] is None
    assert len(lists.tokens) == len(ids) + NEW_TOKENS
    for i in range(1, len(ids)):  # the logits at i - 1 predict prompt token i
        assert lists.token_logprobs[i] == pytest.approx(float(reference[i - 1, ids[i]]), abs=2e-3)
    assert echoed.usage.prompt_tokens_details.cached_tokens == 0  # computed whole, cache or not

    asked = client.completions.create(model=MODEL, prompt=PROMPT, **{
        **GREEDY, "extra_body": {**GREEDY["extra_body"], "prompt_logprobs": 1}}).choices[0]
    shown = asked.model_extra["prompt_logprobs"]
    assert shown[0] is None and len(shown) == len(ids)
    for i, entry in enumerate(shown[1:], 1):
        mine = entry[str(ids[i])]
        assert mine["logprob"] == pytest.approx(float(reference[i - 1, ids[i]]), abs=2e-3)
        row, value = reference[i - 1], reference[i - 1, ids[i]]  # its rank, give or take near-ties
        assert int((row > value + 1e-3).sum()) + 1 <= mine["rank"] <= int((row >= value - 1e-3).sum())
    assert asked.text == choice.text[len(PROMPT):]
    # gRPC: the first message carries them
    (only,) = stub.Generate(gateway_pb2.GenerateRequest(prompt=PROMPT, sampling=greedy(1, prompt_logprobs=1)),
                            timeout=60)
    assert [lp.token_id for lp in only.prompt_logprobs] == ids[1:]
    assert [lp.logprob for lp in only.prompt_logprobs] == pytest.approx([e[str(t)]["logprob"] for e, t in
                                                                         zip(shown[1:], ids[1:], strict=True)])


def test_chat_prompt_logprobs_are_the_rendered_prompt_s_as_completions_gives_them(client, bundled_tokenizer):
    """vLLM's chat ``prompt_logprobs`` (beside the choices) are those /v1/completions gives the prompt the chat
    template renders."""
    tok = bundled_tokenizer
    ids = tok.encode(tok.hf.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True))
    chat = client.chat.completions.create(model=MODEL, messages=CHAT, **{
        **GREEDY, "extra_body": {**GREEDY["extra_body"], "prompt_logprobs": 1}})
    shown = chat.model_extra["prompt_logprobs"]
    assert shown[0] is None and len(shown) == len(ids) == chat.usage.prompt_tokens
    assert all(str(token) in entry for token, entry in zip(ids[1:], shown[1:], strict=True))
    plain = client.completions.create(model=MODEL, prompt=ids, max_tokens=1, temperature=0.0,
                                      extra_body={"prompt_logprobs": 1})
    again = plain.choices[0].model_extra["prompt_logprobs"]
    for mine, theirs, token in zip(shown[1:], again[1:], ids[1:], strict=True):
        assert mine[str(token)]["logprob"] == pytest.approx(theirs[str(token)]["logprob"], abs=1e-4)


def test_allowed_token_ids_hold_on_the_prefill_and_the_decode_node(client, stub, bundled_tokenizer):
    listed = bundled_tokenizer.encode(" red green blue")
    tokens, text, _ = generate(stub, prompt=PROMPT, sampling=greedy(NEW_TOKENS, allowed_token_ids=listed))
    assert len(tokens) == NEW_TOKENS and set(tokens) <= set(listed), text
    completion = client.completions.create(model=MODEL, prompt=PROMPT, **{
        **GREEDY, "extra_body": {**GREEDY["extra_body"], "allowed_token_ids": listed}})
    assert completion.choices[0].text == text


def test_bad_words_hold_on_the_prefill_and_the_decode_node(client, stub, bundled_tokenizer):
    """ " Paris" would be the first token (the prefill node samples it), " named Emma" complete at the third (the
    decode node): both are banned where they would be sampled, through gRPC and HTTP alike."""
    _, text, _ = generate(stub, prompt="The capital of France is", sampling=greedy(NEW_TOKENS))
    assert text.startswith(" Paris")
    _, banned_text, _ = generate(stub, prompt="The capital of France is",
                                 sampling=greedy(NEW_TOKENS, bad_words=["Paris"]))
    assert "Paris" not in banned_text and banned_text != text
    story = "Once upon a time, there was a little"
    _, story_text, _ = generate(stub, prompt=story, sampling=greedy(NEW_TOKENS))
    assert story_text.startswith(" girl named Emma")
    _, unnamed, _ = generate(stub, prompt=story, sampling=greedy(NEW_TOKENS, bad_words=["named Emma"]))
    assert unnamed.startswith(" girl named") and "named Emma" not in unnamed
    completion = client.completions.create(model=MODEL, prompt=story, **{
        **GREEDY, "extra_body": {**GREEDY["extra_body"], "bad_words": ["named Emma"]}})
    assert completion.choices[0].text == unnamed


def test_chat_completions_match_grpc_generate(client, stub):
    messages = [gateway_pb2.ChatMessage(role=m["role"], content=m["content"]) for m in CHAT]
    _tokens, text, last = generate(stub, messages=messages, sampling=greedy(NEW_TOKENS))

    chat = client.chat.completions.create(model=MODEL, messages=CHAT, **GREEDY)
    assert chat.choices[0].message.content == text and chat.choices[0].message.role == "assistant"
    assert (chat.usage.prompt_tokens, chat.usage.completion_tokens) == (last.usage.prompt_tokens, NEW_TOKENS)

    chunks = list(client.chat.completions.create(model=MODEL, messages=CHAT, stream=True, **GREEDY))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_responses_match_grpc_generate_whole_and_streamed(client, stub):
    """``/v1/responses`` with the chat's conversation as its input gives the chat's text, as one message item."""
    messages = [gateway_pb2.ChatMessage(role=m["role"], content=m["content"]) for m in CHAT]
    _tokens, text, last = generate(stub, messages=messages, sampling=greedy(NEW_TOKENS))
    greedy_body = {"temperature": 0.0, "max_output_tokens": NEW_TOKENS, "extra_body": {"ignore_eos": True}}

    response = client.responses.create(model=MODEL, input=CHAT[0]["content"], **greedy_body)
    (message,) = response.output
    assert (message.type, message.role, response.output_text) == ("message", "assistant", text)
    assert (response.status, response.incomplete_details.reason) == ("incomplete", "max_output_tokens")
    assert (response.usage.input_tokens, response.usage.output_tokens) == (last.usage.prompt_tokens, NEW_TOKENS)

    events = list(client.responses.create(model=MODEL, input=CHAT, stream=True, **greedy_body))
    deltas = [event.delta for event in events if event.type == "response.output_text.delta"]
    last = events[-1]  # OpenAI's last event for a response cut by max_output_tokens
    assert (last.type, last.response.status, last.response.output_text) == ("response.incomplete", "incomplete", text)
    assert "".join(deltas) == text


def test_anthropic_messages_match_grpc_generate_whole_and_streamed(cluster, stub):
    """Anthropic's ``/v1/messages`` through the ``anthropic`` package gives the chat's text as one text block."""
    messages = [gateway_pb2.ChatMessage(role=m["role"], content=m["content"]) for m in CHAT]
    _tokens, text, last = generate(stub, messages=messages, sampling=greedy(NEW_TOKENS))
    body = {"model": MODEL, "messages": CHAT, "max_tokens": NEW_TOKENS,
            "extra_body": {"ignore_eos": True, "temperature": 0.0}}  # this anthropic package sends no temperature
    with anthropic.Anthropic(base_url=cluster.http_url, api_key="unused", max_retries=0, timeout=120) as client:
        reply = client.messages.create(**body)
        with client.messages.stream(**body) as stream:
            deltas = list(stream.text_stream)
            final = stream.get_final_message()
    for made in (reply, final):
        (block,) = made.content
        assert (block.type, block.text, made.stop_reason) == ("text", text, "max_tokens")
        assert made.usage.input_tokens + made.usage.cache_read_input_tokens == last.usage.prompt_tokens
        assert made.usage.output_tokens == NEW_TOKENS
    assert "".join(deltas) == text


def test_penalties_min_p_and_logit_bias_as_the_openai_package_sends_them(client, stub, bundled_tokenizer):
    """OpenAI's presence and frequency penalties and logit_bias are arguments of the package; vLLM's
    repetition_penalty and min_p go in ``extra_body``. Each changes the text as gRPC ``Generate`` with the same
    fields does."""
    prompt = "Once upon a time, there was a little cat. The cat"
    _tokens, plain, _ = generate(stub, prompt=prompt, sampling=greedy(NEW_TOKENS))
    was, had = (bundled_tokenizer.encode(word)[0] for word in (" was", " had"))  # greedy: " was named Spark. ..."
    cases = [({"frequency_penalty": 1.0, "presence_penalty": 0.5}, {}),
             ({}, {"repetition_penalty": 1.3}),
             ({"temperature": 0.8, "seed": 11}, {"min_p": 0.1}),
             ({"logit_bias": {str(was): -100, str(had): 3.5}}, {})]
    for arguments, extra in cases:
        fields = {"temperature": 0.0, **arguments, **extra}
        if "logit_bias" in fields:
            fields["logit_bias"] = {int(token): bias for token, bias in fields["logit_bias"].items()}
        _tokens, text, _ = generate(stub, prompt=prompt, sampling=gateway_pb2.SamplingParams(
            max_tokens=NEW_TOKENS, ignore_eos=True, **fields))
        completion = client.completions.create(model=MODEL, prompt=prompt, max_tokens=NEW_TOKENS,
                                               **{"temperature": 0.0, **arguments},
                                               extra_body={"ignore_eos": True, **extra})
        assert completion.choices[0].text == text, fields
        if "temperature" not in arguments:
            assert text != plain, fields  # greedy, and the penalty changed what greedy picks
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=MODEL, prompt=prompt, frequency_penalty=2.5, max_tokens=2)
    assert refused.value.body["param"] == "frequency_penalty"
    wait_idle(stub)


def test_logprobs_as_the_openai_package_reads_them(client, stub, bundled_tokenizer):
    _tokens, text, _ = generate(stub, messages=[gateway_pb2.ChatMessage(role=m["role"], content=m["content"])
                                                     for m in CHAT], sampling=greedy(NEW_TOKENS))
    chat = client.chat.completions.create(model=MODEL, messages=CHAT, logprobs=True, top_logprobs=2, **GREEDY)
    content = chat.choices[0].logprobs.content
    assert len(content) == NEW_TOKENS and "".join(c.token for c in content) == text == chat.choices[0].message.content
    for entry in content:  # greedy: each token is the most likely one
        assert entry.logprob <= 0 and entry.top_logprobs[0].token == entry.token
        assert entry.top_logprobs[0].logprob == entry.logprob >= entry.top_logprobs[1].logprob
    completion = client.completions.create(model=MODEL, prompt=PROMPT, logprobs=0, **GREEDY)
    logprobs = completion.choices[0].logprobs
    assert "".join(logprobs.tokens) == completion.choices[0].text and len(logprobs.token_logprobs) == NEW_TOKENS
    assert logprobs.text_offset[0] == 0 and logprobs.text_offset == sorted(logprobs.text_offset)


def test_n_choices_are_the_requests_seeded_seed_plus_index(client, stub):
    completion = client.completions.create(model=MODEL, prompt=PROMPT, n=2, max_tokens=8, temperature=0.9,
                                           seed=123, extra_body={"ignore_eos": True})
    assert [c.index for c in completion.choices] == [0, 1] and completion.usage.completion_tokens == 16
    for i, choice in enumerate(completion.choices):
        sampling = gateway_pb2.SamplingParams(max_tokens=8, temperature=0.9, seed=123 + i, ignore_eos=True)
        _tokens, text, _ = generate(stub, prompt=PROMPT, sampling=sampling)
        assert choice.text == text


def test_a_batch_of_prompts_gives_each_prompt_what_it_gets_alone(client, stub, bundled_tokenizer):
    prompts = [PROMPT, "Once upon a time", bundled_tokenizer.encode("The sea is")]
    completion = client.completions.create(model=MODEL, prompt=prompts, **GREEDY)
    assert [c.index for c in completion.choices] == [0, 1, 2]
    prompt_tokens = 0
    for prompt, choice in zip(prompts, completion.choices, strict=True):
        by_text = isinstance(prompt, str)
        _tokens, text, _ = generate(stub, sampling=greedy(NEW_TOKENS),
                                   **({"prompt": prompt} if by_text else {"token_ids": prompt}))
        assert choice.text == text and choice.finish_reason == "length"
        prompt_tokens += len(bundled_tokenizer.encode(prompt)) if by_text else len(prompt)
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (prompt_tokens, 3 * NEW_TOKENS)


def test_bad_input_gets_openai_errors_and_the_gateway_keeps_serving(client, cluster, stub):
    with pytest.raises(openai.NotFoundError) as raised:
        client.completions.create(model="gpt-4o", prompt=PROMPT)
    assert (raised.value.status_code, raised.value.code, raised.value.param) == (404, "model_not_found", "model")
    with pytest.raises(openai.BadRequestError) as raised:
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=-1)
    assert (raised.value.param, raised.value.type) == ("max_tokens", "invalid_request_error")
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=0, stream=True)
    assert raised.value.param == "max_tokens"
    with pytest.raises(openai.BadRequestError) as raised:  # past the context of 8192 tokens
        client.completions.create(model=MODEL, prompt=[1] * 9000)
    assert raised.value.param == "prompt"

    with httpx.Client(base_url=cluster.http_url, timeout=60) as http:
        malformed = http.post("/v1/chat/completions", content=b'{"model": "' + MODEL.encode() + b'", "messages": [',
                              headers={"Content-Type": "application/json"})
        assert malformed.status_code == 400 and malformed.json()["error"]["type"] == "invalid_request_error"
        huge = http.post("/v1/completions", content=json.dumps({"model": MODEL, "prompt": "x" * (10 << 20)}),
                         headers={"Content-Type": "application/json"})
        assert huge.status_code == 413 and huge.json()["error"]["code"] == "request_too_large"

    assert client.completions.create(model=MODEL, prompt=PROMPT, **GREEDY).usage.completion_tokens == NEW_TOKENS
    wait_idle(stub)


def test_a_stream_left_early_frees_every_block(cluster, stub):
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 2000, "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=cluster.http_url, timeout=60) as http, \
            http.stream("POST", "/v1/completions", json=body) as reply:
        assert reply.status_code == 200
        received = 0
        for line in reply.iter_lines():
            received += line.startswith("data: ")
            if received == 3:
                break  # and leave: the response is closed mid-stream
    wait_idle(stub, timeout_s=10)  # generating the 2000 tokens would take far longer: it was cancelled

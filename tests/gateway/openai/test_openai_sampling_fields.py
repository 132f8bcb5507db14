"""Every sampling field reaches the gateway's ``SamplingFields`` from an OpenAI body: the fields the body
declares under their own name are taken by name, so a new one needs no code in ``translate``."""

from __future__ import annotations

import dataclasses

from services.common.sampling_convert import SamplingFields
from services.gateway.openai import translate
from services.gateway.openai.schemas import ChatCompletionBody, CompletionBody, GenerationBody

# non-default values, as the HTTP API takes them
BODY = {"temperature": 0.5, "top_p": 0.25, "top_k": 40, "seed": 9, "stop": ["END"], "stop_token_ids": [2, 7],
        "ignore_eos": True, "min_tokens": 3, "presence_penalty": -0.5, "frequency_penalty": 1.25,
        "repetition_penalty": 1.125, "min_p": 0.0625, "logit_bias": {"11": 0.5, "3": -100.0},
        "include_stop_str_in_output": True, "skip_special_tokens": False, "allowed_token_ids": [4, 8],
        "bad_words": ["Paris", "no way"]}
EXPECTED = SamplingFields(max_tokens=12, logprobs=2, temperature=0.5, top_p=0.25, top_k=40, seed=9, stop=("END",),
                          stop_token_ids=(2, 7), ignore_eos=True, min_tokens=3, presence_penalty=-0.5,
                          frequency_penalty=1.25, repetition_penalty=1.125, min_p=0.0625,
                          logit_bias=((11, 0.5), (3, -100.0)), include_stop_str_in_output=True,
                          skip_special_tokens=False, allowed_token_ids=(4, 8), bad_words=("Paris", "no way"))


def test_every_sampling_field_is_read_from_the_body():
    names = {f.name for f in dataclasses.fields(SamplingFields)}
    assert set(translate._BY_NAME) | set(translate._NOT_BY_NAME) == names
    assert set(translate._BY_NAME) <= set(GenerationBody.model_fields)
    # this test sets each one; structured comes from response_format and the guided_* fields (issue 26)
    assert set(BODY) | {"max_tokens", "logprobs", "prompt_logprobs", "structured"} == names


def test_completion_body_to_sampling_fields():
    body = CompletionBody.model_validate({"prompt": "Hi", "max_tokens": 12, "logprobs": 2, **BODY})
    assert translate.completion_inputs(body, "r")[0].sampling == EXPECTED
    # prompt logprobs: vLLM's field, and echo's with logprobs; the larger k
    for extra, k in (({"prompt_logprobs": 4}, 4), ({"echo": True}, 2), ({"echo": True, "prompt_logprobs": 1}, 2),
                     ({"echo": True, "logprobs": None}, None)):
        body = CompletionBody.model_validate({"prompt": "Hi", "max_tokens": 12, "logprobs": 2, **BODY, **extra})
        assert translate.completion_inputs(body, "r")[0].sampling.prompt_logprobs == k, extra


def test_chat_body_to_sampling_fields():
    body = ChatCompletionBody.model_validate({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1,
                                              "max_completion_tokens": 12, "logprobs": True, "top_logprobs": 2,
                                              **BODY})
    assert translate.chat_input(body, "r").sampling == EXPECTED


def test_unset_stays_unset():
    body = CompletionBody.model_validate({"prompt": "Hi"})
    assert translate.completion_inputs(body, "r")[0].sampling == SamplingFields(presence_penalty=0.0,
                                                                                 frequency_penalty=0.0)
    assert SamplingFields().resolve().skip_special_tokens is True

"""The OpenAI target's requests and its reading of server-sent events, against scripted HTTP replies
(httpx's MockTransport; the real servers are exercised by tests/e2e/test_bench_serve.py)."""

from __future__ import annotations

import json

import httpx

from services.bench.datasets import BenchRequest
from services.bench.openai_target import OpenAITarget
from services.bench.targets import SamplingSpec, TargetSpec

REQUEST = BenchRequest(prompt=" system words question", prompt_ids=(1, 2, 3, 4), output_len=3,
                       system=" system words", group=0)


def sse(*chunks: object) -> bytes:
    return b"".join(f"data: {c if isinstance(c, str) else json.dumps(c)}\n\n".encode() for c in chunks)


def target(handler, endpoint: str = "/v1/completions", ignore_eos: bool = True,
           logprobs: int | None = None) -> OpenAITarget:
    client = httpx.AsyncClient(base_url="http://server", transport=httpx.MockTransport(handler))
    sampling = SamplingSpec(endpoint=endpoint, ignore_eos=ignore_eos)
    return OpenAITarget(TargetSpec("t", "http://server", logprobs), sampling, "m", client)


async def test_completion_stream_with_usage():
    bodies = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(200, content=sse(
            {"choices": [{"text": " a"}]}, {"choices": [{"text": " b c"}]},
            {"choices": [{"text": "", "finish_reason": "length"}]},
            {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3}}, "[DONE]"))

    t = target(handler)
    result = await t.generate(REQUEST)
    await t.close()
    assert bodies == [{"model": "m", "max_tokens": 3, "temperature": 0.0, "stream": True,
                       "stream_options": {"include_usage": True}, "ignore_eos": True, "min_tokens": 3,
                       "prompt": " system words question"}]
    assert result.ok and result.prompt_len == 5 and result.output_tokens == 3  # usage wins over chunks
    assert len(result.itl_s) == 1 and result.ttft_s > 0 and result.latency_s >= result.ttft_s


async def test_chat_stream_without_usage_counts_content_chunks():
    bodies = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(200, content=sse(
            {"choices": [{"delta": {"role": "assistant"}}]}, {"choices": [{"delta": {"content": "x"}}]},
            {"choices": [{"delta": {"content": "y"}}]}, {"choices": [{"delta": {}, "finish_reason": "length"}]},
            "[DONE]"))

    t = target(handler, endpoint="/v1/chat/completions", ignore_eos=False)
    result = await t.generate(REQUEST)
    await t.close()
    assert bodies[0]["messages"] == [{"role": "system", "content": " system words"},
                                     {"role": "user", "content": " question"}]
    assert "ignore_eos" not in bodies[0] and "min_tokens" not in bodies[0]
    assert result.ok and result.output_tokens == 2 and result.prompt_len == 4


async def test_errors_make_failed_outcomes():
    def refuse(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"error": {"message": "max_tokens must be positive", "type": "bad"}})

    def broken(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=sse({"choices": [{"text": "a"}]}, {"error": {"message": "died"}}))

    def unreachable(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    def cut_short(request: httpx.Request) -> httpx.Response:  # llama-cpp-python's interrupt_requests
        return httpx.Response(200, content=sse({"choices": [{"text": "a"}]}, "[DONE]"))

    outcomes = []
    for handler in (refuse, broken, unreachable, cut_short):
        t = target(handler)
        outcomes.append(await t.generate(REQUEST))
        await t.close()
    assert [o.ok for o in outcomes] == [False, False, False, False]
    assert "HTTP 400" in outcomes[0].error and "max_tokens must be positive" in outcomes[0].error
    assert "died" in outcomes[1].error
    assert "ConnectError" in outcomes[2].error
    assert "without a finish_reason" in outcomes[3].error and outcomes[3].output_tokens == 1


def test_a_logprobs_target_asks_for_them_in_each_api_s_terms():
    assert "logprobs" not in target(None).body(REQUEST)
    assert target(None, logprobs=5).body(REQUEST)["logprobs"] == 5
    chat = target(None, endpoint="/v1/chat/completions", logprobs=0).body(REQUEST)
    assert (chat["logprobs"], chat["top_logprobs"]) == (True, 0)

"""Any OpenAI-compatible server over HTTP: ``/v1/completions`` (text prompt) or ``/v1/chat/completions``
(system + user messages), streamed as server-sent events.

Each request asks for ``stream_options.include_usage``; token counts come from the final usage chunk when
the server sends one, otherwise each content chunk counts as one token (llama-cpp-python's server sends one
chunk per token and no usage). With ``ignore_eos`` the request carries vLLM's ``ignore_eos`` and
``min_tokens = max_tokens`` (what llama-cpp-python's server honours) so both kinds of server generate
exactly ``max_tokens``; the outcome reports what was actually generated either way.

An API key (``OPENAI_API_KEY``, else the first of ``PDSERVE_API_KEY``) goes as ``Authorization: Bearer``.
"""

from __future__ import annotations

import json
import os
from typing import Any

import httpx

from services.bench.datasets import BenchRequest
from services.bench.outcome import RequestOutcome, StreamTimer
from services.bench.targets import SamplingSpec, TargetSpec


class OpenAITarget:
    def __init__(self, spec: TargetSpec, sampling: SamplingSpec, model: str, client: httpx.AsyncClient):
        self.spec, self.sampling, self.model, self._client = spec, sampling, model, client

    @classmethod
    async def open(cls, spec: TargetSpec, sampling: SamplingSpec) -> OpenAITarget:
        """Connect; without ``sampling.model`` ask ``/v1/models`` for the first model's id."""
        key = os.environ.get("OPENAI_API_KEY") or os.environ.get("PDSERVE_API_KEY", "").split(",")[0].strip()
        client = httpx.AsyncClient(base_url=spec.url, timeout=httpx.Timeout(sampling.timeout_s, connect=10.0),
                                   headers={"Authorization": f"Bearer {key}"} if key else None,
                                   limits=httpx.Limits(max_connections=None, max_keepalive_connections=None))
        model = sampling.model
        if not model:
            try:
                reply = await client.get("/v1/models")
                reply.raise_for_status()
                model = reply.json()["data"][0]["id"]
            except BaseException:
                await client.aclose()
                raise
        return cls(spec, sampling, model, client)

    def body(self, request: BenchRequest) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "max_tokens": request.output_len,
                                "temperature": self.sampling.temperature, "stream": True,
                                "stream_options": {"include_usage": True}}
        if self.sampling.ignore_eos:
            body |= {"ignore_eos": True, "min_tokens": request.output_len}
        if self.spec.logprobs is not None:
            body |= {"logprobs": True, "top_logprobs": self.spec.logprobs} if self.chat else \
                {"logprobs": self.spec.logprobs}
        if self.chat:
            messages = [{"role": "system", "content": request.system}] if request.system else []
            messages.append({"role": "user", "content": request.prompt[len(request.system):]})
            body["messages"] = messages
        else:
            body["prompt"] = request.prompt
        return body

    @property
    def chat(self) -> bool:
        return self.sampling.endpoint.endswith("chat/completions")

    async def generate(self, request: BenchRequest) -> RequestOutcome:
        timer = StreamTimer()
        usage: dict[str, Any] | None = None
        finished = False
        try:
            async with self._client.stream("POST", self.sampling.endpoint, json=self.body(request)) as reply:
                if reply.status_code != 200:
                    text = (await reply.aread()).decode(errors="replace")
                    return timer.outcome(request.prompt_len, error=f"HTTP {reply.status_code}: {text[:500]}")
                async for line in reply.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    chunk = json.loads(data)
                    if "error" in chunk:
                        return timer.outcome(request.prompt_len, error=f"stream error: {chunk['error']}")
                    if self._content(chunk):
                        timer.arrived(1)
                    finished = finished or any(c.get("finish_reason") for c in chunk.get("choices") or ())
                    usage = chunk.get("usage") or usage
        except (httpx.HTTPError, json.JSONDecodeError) as exc:
            return timer.outcome(request.prompt_len, error=f"{type(exc).__name__}: {exc}")
        if not finished:  # cut short (llama-cpp-python's server does that with interrupt_requests on)
            return timer.outcome(request.prompt_len, error="the stream ended without a finish_reason")
        if usage:
            return timer.outcome(usage.get("prompt_tokens") or request.prompt_len, usage.get("completion_tokens"))
        return timer.outcome(request.prompt_len)

    def _content(self, chunk: dict[str, Any]) -> str:
        choices = chunk.get("choices") or []
        if not choices:
            return ""
        if self.chat:
            return (choices[0].get("delta") or {}).get("content") or ""
        return choices[0].get("text") or ""

    async def close(self) -> None:
        await self._client.aclose()

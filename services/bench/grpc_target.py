"""pdserve's gateway over gRPC (``Gateway.Generate``, pdserve.v1): the prompt goes as token ids (a chat
endpoint sends messages instead), token counts come from the stream, prompt length from ``usage``. The
first key of ``PDSERVE_API_KEY``, when set, goes as ``authorization: Bearer``."""

from __future__ import annotations

import os

import grpc.aio
from pdserve.v1 import gateway_pb2, gateway_pb2_grpc

from services.bench.datasets import BenchRequest
from services.bench.outcome import RequestOutcome, StreamTimer
from services.bench.targets import SamplingSpec, TargetSpec


class GrpcTarget:
    def __init__(self, spec: TargetSpec, sampling: SamplingSpec):
        self.spec, self.sampling = spec, sampling
        self._channel = grpc.aio.insecure_channel(spec.address)
        self._stub = gateway_pb2_grpc.GatewayStub(self._channel)
        key = next((k.strip() for k in os.environ.get("PDSERVE_API_KEY", "").split(",") if k.strip()), "")
        self._metadata = (("authorization", f"Bearer {key}"),) if key else None  # a gateway run with API keys

    def request_message(self, request: BenchRequest) -> gateway_pb2.GenerateRequest:
        sampling = gateway_pb2.SamplingParams(max_tokens=request.output_len, temperature=self.sampling.temperature,
                                              ignore_eos=self.sampling.ignore_eos, logprobs=self.spec.logprobs)
        if self.sampling.endpoint.endswith("chat/completions"):
            messages = [gateway_pb2.ChatMessage(role="system", content=request.system)] if request.system else []
            messages.append(gateway_pb2.ChatMessage(role="user", content=request.prompt[len(request.system):]))
            return gateway_pb2.GenerateRequest(messages=messages, sampling=sampling)
        return gateway_pb2.GenerateRequest(token_ids=request.prompt_ids, sampling=sampling)

    async def generate(self, request: BenchRequest) -> RequestOutcome:
        message = self.request_message(request)
        timer = StreamTimer()
        prompt_len = request.prompt_len
        try:
            async for response in self._stub.Generate(message, timeout=self.sampling.timeout_s,
                                                      metadata=self._metadata):
                timer.arrived(len(response.token_ids))
                if response.finish_reason:
                    prompt_len = response.usage.prompt_tokens or prompt_len
        except grpc.aio.AioRpcError as exc:
            return timer.outcome(prompt_len, error=f"{exc.code().name}: {exc.details()}")
        return timer.outcome(prompt_len)

    async def close(self) -> None:
        await self._channel.close()

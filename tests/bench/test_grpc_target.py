"""The gRPC target's request messages (the real gateway is exercised by tests/e2e/test_bench_serve.py)."""

from __future__ import annotations

from services.bench.datasets import BenchRequest
from services.bench.grpc_target import GrpcTarget
from services.bench.targets import SamplingSpec, TargetSpec

REQUEST = BenchRequest(prompt=" system words question", prompt_ids=(1, 2, 3, 4), output_len=3,
                       system=" system words", group=0)


async def test_logprobs_are_asked_for_only_by_a_logprobs_target():
    plain = GrpcTarget(TargetSpec.parse("grpc://127.0.0.1:1"), SamplingSpec())
    top5 = GrpcTarget(TargetSpec.parse("grpc://127.0.0.1:1?logprobs=5"), SamplingSpec())
    try:
        assert not plain.request_message(REQUEST).sampling.HasField("logprobs")
        message = top5.request_message(REQUEST)
        assert message.sampling.logprobs == 5 and list(message.token_ids) == [1, 2, 3, 4]
    finally:
        await plain.close()
        await top5.close()

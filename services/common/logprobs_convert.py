"""``pdserve.v1.TokenLogprob`` ↔ ``services.engine.logprobs.TokenLogprobs``."""

from __future__ import annotations

from collections.abc import Iterable

from pdserve.v1 import gateway_pb2

from services.engine.logprobs import TokenLogprobs


def logprob_to_proto(logprobs: TokenLogprobs) -> gateway_pb2.TokenLogprob:
    return gateway_pb2.TokenLogprob(
        token_id=logprobs.token_id, logprob=logprobs.logprob, rank=logprobs.rank,
        top=[gateway_pb2.TopLogprob(token_id=token_id, logprob=value) for token_id, value in logprobs.top])


def logprobs_to_proto(logprobs: Iterable[TokenLogprobs]) -> list[gateway_pb2.TokenLogprob]:
    return [logprob_to_proto(lp) for lp in logprobs]


def logprob_from_proto(message: gateway_pb2.TokenLogprob) -> TokenLogprobs:
    return TokenLogprobs(message.token_id, message.logprob, tuple((t.token_id, t.logprob) for t in message.top),
                         message.rank)


def logprobs_from_proto(messages: Iterable[gateway_pb2.TokenLogprob]) -> list[TokenLogprobs]:
    return [logprob_from_proto(m) for m in messages]

"""``pdserve.v1.Gateway`` over a ``GatewayCore``: decode the proto, call the core, encode."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import grpc
import grpc.aio
from pdserve.v1 import gateway_pb2, gateway_pb2_grpc

from services.common import tracing
from services.common.errors import grpc_errors, map_error
from services.common.logprobs_convert import logprobs_to_proto
from services.common.sampling_convert import fields_from_proto
from services.common.tracing import traced_rpc
from services.engine.errors import InvalidRequestError
from services.gateway.core import GatewayCore
from services.gateway.embedding import EmbedInput
from services.gateway.generation import GenerateChunk, GenerateInput
from services.gateway.metrics import GatewayMetrics, tracked
from services.gateway.nodes import STATUS_FIELDS, NodeInfo
from services.gateway.redaction import redact_stream_errors

map_error(InvalidRequestError, grpc.StatusCode.INVALID_ARGUMENT)


def input_from_proto(request: gateway_pb2.GenerateRequest) -> GenerateInput:
    """Empty ``prompt`` / ``token_ids`` / ``messages`` count as not given (proto3 has no presence). The
    repeated fields are passed as they are, uncopied (a proto ``ChatMessage`` has ``role`` and ``content``
    too): validation refuses more of them than the context holds before it reads them."""
    return GenerateInput(
        request_id=request.request_id,
        prompt=request.prompt or None,
        token_ids=request.token_ids or None,
        messages=request.messages or None,
        sampling=fields_from_proto(request.sampling),
        truncate_prompt_tokens=request.truncate_prompt_tokens if request.HasField("truncate_prompt_tokens") else None,
    )


def embed_input_from_proto(request: gateway_pb2.EmbedRequest) -> EmbedInput:
    return EmbedInput(
        request_id=request.request_id, prompt=request.prompt or None, token_ids=request.token_ids or None,
        truncate_prompt_tokens=request.truncate_prompt_tokens if request.HasField("truncate_prompt_tokens") else None,
        normalize=request.normalize if request.HasField("normalize") else True, dimensions=request.dimensions,
        add_special_tokens=request.add_special_tokens if request.HasField("add_special_tokens") else True)


def chunk_to_proto(chunk: GenerateChunk) -> gateway_pb2.GenerateResponse:
    response = gateway_pb2.GenerateResponse(
        request_id=chunk.request_id, token_ids=chunk.token_ids, text=chunk.text,
        finish_reason=chunk.finish_reason, prefill_node=chunk.prefill_node, decode_node=chunk.decode_node,
        logprobs=logprobs_to_proto(chunk.logprobs), prompt_logprobs=logprobs_to_proto(chunk.prompt_logprobs))
    if chunk.usage is not None:
        usage = chunk.usage
        response.usage.CopyFrom(gateway_pb2.Usage(prompt_tokens=usage.prompt_tokens,
                                                  completion_tokens=usage.completion_tokens,
                                                  cached_tokens=usage.cached_tokens))
    return response


def node_status_to_proto(node: NodeInfo) -> gateway_pb2.NodeStatus:
    return gateway_pb2.NodeStatus(address=node.address, role=node.role, error=node.error,
                                  **{name: getattr(node, name) for name in STATUS_FIELDS})


class GatewayServicer(gateway_pb2_grpc.GatewayServicer):
    def __init__(self, core: GatewayCore, metrics: GatewayMetrics | None = None) -> None:
        self.core = core
        self.metrics = metrics
        self.metrics_url = ""  # the gateway's own /metrics, set once the server is bound
        self.http_url = ""  # the OpenAI-compatible HTTP front, set once it is bound (empty: off)
        self.served_model_name = ""  # the model id of the HTTP front

    @grpc_errors
    @redact_stream_errors
    @tracked(chunk_to_proto)
    @traced_rpc("Generate", root=True)
    async def Generate(self, request: gateway_pb2.GenerateRequest,  # type: ignore[override]
                       context: grpc.aio.ServicerContext) -> AsyncIterator[GenerateChunk]:
        """Stream a completion (see gateway.proto). Bad input fails before any node is called; cancelling
        the call, or its deadline passing, aborts the request on its prefill and decode nodes. The root
        span of the request's trace (or a child of the caller's ``traceparent``)."""
        flow = await self.core.open(input_from_proto(request), context.time_remaining())
        tracing.bind_request(flow.request_id)
        context.add_done_callback(lambda _: flow.cancel("client cancelled or deadline passed"))
        async with contextlib.aclosing(flow.run()) as chunks:
            async for chunk in chunks:
                yield chunk  # encoded by @tracked, which counts it first

    @grpc_errors
    @traced_rpc("Embed", root=True)
    async def Embed(self, request: gateway_pb2.EmbedRequest, context: grpc.aio.ServicerContext
                    ) -> gateway_pb2.EmbedResponse:
        """One input's embedding (see gateway.proto); cancelling the call cancels its prefill node's."""
        embedding = await self.core.embed(embed_input_from_proto(request), context.time_remaining())
        return gateway_pb2.EmbedResponse(
            request_id=embedding.request_id, embedding=embedding.values, prefill_node=embedding.prefill_node,
            usage=gateway_pb2.Usage(prompt_tokens=embedding.prompt_tokens, cached_tokens=embedding.cached_tokens))

    @grpc_errors
    async def ClusterStatus(self, request: gateway_pb2.ClusterStatusRequest, context: grpc.aio.ServicerContext
                            ) -> gateway_pb2.ClusterStatusResponse:
        """Every configured node as of a poll at most ``status_max_age_s`` old, and the gateway's model."""
        nodes = await self.core.cluster_status()
        model = self.core.directory.model
        return gateway_pb2.ClusterStatusResponse(
            nodes=[node_status_to_proto(n) for n in nodes], gateway_metrics_url=self.metrics_url,
            http_url=self.http_url, served_model_name=self.served_model_name,
            model_name=model.name if model else "", weights_digest=model.weights_digest if model else "")

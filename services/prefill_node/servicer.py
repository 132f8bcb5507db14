"""``pdserve.v1.PrefillNode``: decodes protos, calls :class:`PrefillNode`, encodes the events."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator

import grpc.aio
from pdserve.v1 import gateway_pb2, node_pb2, prefill_pb2, prefill_pb2_grpc

import services.engine_node.errors  # noqa: F401  (the engine's errors as status codes)
from services.common.errors import InvalidArgumentError, grpc_errors
from services.common.field_checks import check_addresses, check_request_id
from services.common.logprobs_convert import logprob_to_proto, logprobs_to_proto
from services.common.sampling_convert import sampling_from_proto
from services.common.tracing import traced_rpc
from services.engine.engine import LLMEngine
from services.engine_node.status import node_status
from services.prefill_node.embedding import embed
from services.prefill_node.node import Done, FirstToken, PrefillNode, Refused, Reserved


class PrefillNodeServicer(prefill_pb2_grpc.PrefillNodeServicer):
    def __init__(self, node: PrefillNode):
        self.node = node
        self.address = ""
        self.metrics_url = ""  # both set once the server is bound

    @grpc_errors
    @traced_rpc("Prefill")
    async def Prefill(self, request: prefill_pb2.PrefillRequest, context: grpc.aio.ServicerContext
                      ) -> AsyncIterator[prefill_pb2.PrefillEvent]:
        check_request_id(request.request_id)
        if not request.decode_candidates:
            raise InvalidArgumentError("decode_candidates", "at least one decode node is required")
        check_addresses(request.decode_candidates, "decode_candidates")
        sampling = sampling_from_proto(request.sampling)
        sampling = dataclasses.replace(sampling, stop=())  # stop strings are the gateway's
        events = self.node.prefill(request.request_id, list(request.prompt_token_ids), sampling,
                                   list(request.decode_candidates), context.time_remaining())
        async with contextlib.aclosing(events):  # its cleanup runs when this call ends, however it ends
            async for event in events:
                yield _encode(event)

    @grpc_errors
    @traced_rpc("Embed")
    async def Embed(self, request: prefill_pb2.PrefillEmbedRequest, context: grpc.aio.ServicerContext
                    ) -> prefill_pb2.PrefillEmbedResponse:
        check_request_id(request.request_id)
        embedded = await embed(self.node, request.request_id, list(request.prompt_token_ids))
        return prefill_pb2.PrefillEmbedResponse(embedding=embedded.embedding, cached_tokens=embedded.cached_tokens)

    @grpc_errors
    @traced_rpc("Abort")
    async def Abort(self, request: node_pb2.AbortRequest, context: grpc.aio.ServicerContext) -> node_pb2.AbortResponse:
        check_request_id(request.request_id)
        return node_pb2.AbortResponse(found=await self.node.abort(request.request_id))

    @grpc_errors
    async def NodeStatus(self, request: node_pb2.NodeStatusRequest, context: grpc.aio.ServicerContext
                         ) -> gateway_pb2.NodeStatus:
        return await self.status()

    async def status(self) -> gateway_pb2.NodeStatus:
        """What ``NodeStatus`` answers (also read by ``/metrics``; on the event loop)."""
        engine_stats = await self.node.worker.call(LLMEngine.stats)
        status = node_status(engine_stats, "prefill", self.address, not self.node.draining)
        status.metrics_url = self.metrics_url
        status.requests_waiting += self.node.preparing
        status.calls_in_flight = len(self.node.live)
        if self.node.prefix_store is not None:
            stats = self.node.prefix_store.stats
            status.store_hit_tokens_total = stats.hit_tokens_total
            status.store_fetched_bytes_total = stats.fetched_bytes_total
            status.store_written_blocks_total = stats.written_blocks_total
            status.store_breaker_trips_total += self.node.prefix_store.breaker.trips_total
        return status


def _encode(event: Refused | Reserved | FirstToken | Done) -> prefill_pb2.PrefillEvent:
    if isinstance(event, Refused):
        return prefill_pb2.PrefillEvent(refused=prefill_pb2.Refused(decode_address=event.decode_address,
                                                                    reason=event.reason))
    if isinstance(event, Reserved):
        return prefill_pb2.PrefillEvent(reserved=prefill_pb2.Reserved(
            decode_address=event.decode_address, num_cached_blocks=event.num_cached_blocks,
            lease_deadline_unix_ms=event.lease_deadline_unix_ms))
    if isinstance(event, FirstToken):
        first = prefill_pb2.FirstToken(token_id=event.token_id, finish_reason=event.finish_reason or "",
                                       cached_tokens=event.cached_tokens,
                                       prompt_logprobs=logprobs_to_proto(event.prompt_logprobs))
        if event.logprob is not None:
            first.logprob.CopyFrom(logprob_to_proto(event.logprob))
        return prefill_pb2.PrefillEvent(first_token=first)
    return prefill_pb2.PrefillEvent(done=prefill_pb2.Done(
        num_computed_tokens=event.num_computed_tokens, kv_bytes_sent=event.kv_bytes_sent,
        kv_blocks_sent=event.kv_blocks_sent))

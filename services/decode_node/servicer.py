"""``pdserve.v1.DecodeNode``: decodes protos, calls :class:`DecodeNode`, encodes the answers."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator

import grpc.aio
from google.protobuf.message import DecodeError
from pdserve.v1 import decode_pb2, decode_pb2_grpc, gateway_pb2, node_pb2

import services.engine_node.errors  # noqa: F401  (the engine's errors as status codes)
from kvcache.cuda_ipc import IpcError
from services.common import tracing
from services.common.errors import (
    FailedPreconditionError,
    grpc_errors,
    mapped_errors,
    status_of,
)
from services.common.field_checks import check_addresses, check_request_id
from services.common.logprobs_convert import logprobs_to_proto
from services.common.sampling_convert import sampling_from_proto
from services.common.stream_close import ATTACH_FINAL
from services.common.tls.roles import caller_name as caller_of
from services.common.tls.roles import caller_roles
from services.common.tracing import traced_rpc
from services.decode_node.caller_identity import needs_grant_token
from services.decode_node.grants import PermissionDeniedError
from services.decode_node.handover import Route
from services.decode_node.message_checks import check_adopt, check_batch, check_reserve
from services.decode_node.node import DecodeNode
from services.decode_node.token_stream import TokenEvent
from services.decode_node.transfer_gate import TransferGate
from services.engine.decode_role import HandedRequest, Refusal
from services.engine.engine import LLMEngine
from services.engine_node.kv_ipc_wire import answer_to_proto, offer_from_proto
from services.engine_node.kv_layout import kv_layout
from services.engine_node.status import node_status


class DecodeNodeServicer(decode_pb2_grpc.DecodeNodeServicer):
    def __init__(self, node: DecodeNode):
        self.node = node
        self.layout = kv_layout(node.engine.kv_layout_spec())
        self.metrics_url = ""  # set once the server is bound

    @property
    def address(self) -> str:
        return self.node.address

    @address.setter
    def address(self, value: str) -> None:  # set once the server is bound; the node leaves itself out of peers
        self.node.address = value

    @grpc_errors
    @traced_rpc("Reserve")
    async def Reserve(self, request: decode_pb2.ReserveRequest, context: grpc.aio.ServicerContext
                      ) -> decode_pb2.ReserveResponse:
        check_request_id(request.request_id)
        if request.HasField("layout"):
            self._check_layout(request.layout)
        elif request.model_fingerprint and request.model_fingerprint != self.layout.model_fingerprint:
            raise FailedPreconditionError("model_fingerprint: this decode node serves another model or KV layout")
        check_reserve(request, self.layout.block_size if request.HasField("layout") else 0, int(time.time() * 1000))
        sampling = sampling_from_proto(request.sampling, default_max_tokens=request.max_tokens or 16)
        sampling = dataclasses.replace(sampling, stop=())  # stop strings are the gateway's
        route = Route(list(request.decode_peers), request.deadline_unix_ms)
        result = await self.node.reserve(request.request_id, list(request.prompt_token_ids), sampling,
                                         request.lease_ms / 1000 if request.lease_ms else None, route,
                                         caller=caller_of(context))
        if isinstance(result, Refusal):
            return decode_pb2.ReserveResponse(granted=False, reason=result.reason, block_size=self.layout.block_size,
                                              retry_after_ms=50)
        return decode_pb2.ReserveResponse(
            granted=True, block_ids=result.block_ids, num_cached_blocks=result.num_cached_blocks,
            lease_deadline_unix_ms=result.lease_deadline_unix_ms, block_size=self.layout.block_size,
            lease_ms=round(result.lease_s * 1000), grant_token=result.token,
        )

    @traced_rpc("TransferKV")
    async def TransferKV(self, request_iterator: AsyncIterator[decode_pb2.KVTransferMessage],
                         context: grpc.aio.ServicerContext) -> AsyncIterator[decode_pb2.KVAck]:
        """Each message passes the stream's gate (seq, grant token, IPC session: a refusal there changes
        nothing), then acts on its request; a failure after the gate is the grant holder's own and fails
        its request (its blocks freed, later messages of it answered with the same error)."""
        failed: dict[str, decode_pb2.KVAck] = {}
        gate = TransferGate(self.node.grants, self.node.ipc, caller_of(context))
        try:
            async for message in request_iterator:
                kind = message.WhichOneof("kind")
                request_id = getattr(message, kind).request_id if kind is not None else ""
                try:
                    gate.check_seq(message.seq)
                    if kind is None:  # a kind this node does not know (a newer prefill node): nothing to do
                        yield decode_pb2.KVAck(seq=message.seq)
                        continue
                    check_request_id(request_id, f"{kind}.request_id")
                    if request_id in failed:
                        yield decode_pb2.KVAck(seq=message.seq, request_id=request_id,
                                               error=failed[request_id].error, code=failed[request_id].code)
                        continue
                    gate.admit(message, kind, request_id)
                except mapped_errors() as error:  # refused before touching anything: nothing to fail or abort
                    yield _error_ack(message.seq, request_id if kind else "", error)
                    continue
                try:
                    yield await self._handle(message, kind, request_id, gate.ipc_sessions)
                except mapped_errors() as error:
                    ack = failed[request_id] = _error_ack(message.seq, request_id, error)
                    await self.node.abort(request_id, f"its KV transfer failed: {error}")
                    yield ack
        except DecodeError as error:  # a message that is not a KVTransferMessage (the stream's own bytes)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"request: a message of the stream is not a valid KVTransferMessage ({error})")

    async def _handle(self, message: decode_pb2.KVTransferMessage, kind: str, request_id: str,
                      ipc_sessions: dict[str, str]) -> decode_pb2.KVAck:
        if kind == "header":
            tracing.bind_request(request_id)
            self._check_layout(message.header.layout)
            lease = await self.node.renew(request_id)  # NOT_FOUND unless the request is reserved here
            return decode_pb2.KVAck(seq=message.seq, request_id=request_id, lease_deadline_unix_ms=lease)
        if kind == "blocks":
            check_batch(message.blocks, self.layout.bytes_per_block)
        if kind == "blocks" and message.blocks.source_block_ids:
            return await self._receive_by_reference(message, request_id, ipc_sessions.get(request_id, ""))
        if kind == "state":
            state = message.state
            lease = await self.node.receive_state(request_id, state.offset, state.total_bytes, state.payload)
            return decode_pb2.KVAck(seq=message.seq, request_id=request_id, lease_deadline_unix_ms=lease)
        if kind == "keepalive":
            lease = await self.node.renew(request_id)
            return decode_pb2.KVAck(seq=message.seq, request_id=request_id, lease_deadline_unix_ms=lease)
        if kind == "blocks":
            lease = await self.node.receive(request_id, list(message.blocks.block_ids), message.blocks.payload)
            return decode_pb2.KVAck(seq=message.seq, request_id=request_id, lease_deadline_unix_ms=lease)
        with tracing.span("commit", request_id=request_id):
            await self.node.commit(request_id, message.commit.first_token_id, message.commit.num_computed_tokens)
        return decode_pb2.KVAck(seq=message.seq, request_id=request_id, committed=True)

    async def _receive_by_reference(self, message: decode_pb2.KVTransferMessage, request_id: str,
                                    session_id: str) -> decode_pb2.KVAck:
        """A batch of source block ids: copied by CUDA IPC, or answered with ``ipc_error`` (nothing taken;
        the prefill node sends the bytes instead)."""
        batch = message.blocks  # its form checked by check_batch
        try:
            if not session_id:
                raise IpcError("the request's header named no IPC session")
            lease = await self.node.receive_by_reference(request_id, list(batch.block_ids),
                                                         list(batch.source_block_ids), session_id)
        except IpcError as error:
            return decode_pb2.KVAck(seq=message.seq, request_id=request_id, ipc_error=str(error))
        return decode_pb2.KVAck(seq=message.seq, request_id=request_id, lease_deadline_unix_ms=lease)

    def _check_layout(self, layout: node_pb2.KVLayout) -> None:
        mine = self.layout
        for name in ("dtype", "block_size", "num_layers", "num_kv_heads", "head_dim", "model_fingerprint",
                     "bytes_per_block"):
            theirs, ours = getattr(layout, name), getattr(mine, name)
            if theirs != ours:
                if isinstance(theirs, bytes):  # a fingerprint: never told (it identifies the model's weights)
                    raise FailedPreconditionError(f"layout.{name}: the sender's differs from this node's: another "
                                                  f"model, weights or settings (its KV cannot be used here)")
                raise FailedPreconditionError(f"layout.{name}: sender has {theirs!r}, this node {ours!r} (its KV "
                                              f"cannot be used here)")

    @grpc_errors
    @traced_rpc("Adopt")
    async def Adopt(self, request: decode_pb2.AdoptRequest, context: grpc.aio.ServicerContext
                    ) -> decode_pb2.AdoptResponse:
        """Take over a request another decode node preempted (its KV in ``request.cache_store``): granted
        means it runs here and its tokens wait for an ``Attach``; a refusal leaves nothing behind."""
        recompute = request.num_computed_tokens == 0 and not request.kv_keys
        roles = caller_roles(context)
        if roles and "decode" not in roles and not recompute:  # a gateway resuming a request elsewhere
            raise PermissionDeniedError("Adopt: a gateway hands a request over as tokens only (num_computed_tokens "
                                        "0, no kv_keys)")
        if request.model_fingerprint != self.layout.model_fingerprint and not (recompute and
                                                                                not request.model_fingerprint):
            raise FailedPreconditionError("model_fingerprint: this decode node serves another model or KV layout")
        check_adopt(request, self.layout.model_fingerprint)
        sampling = sampling_from_proto(request.sampling)
        sampling = dataclasses.replace(sampling, stop=())  # stop strings are the gateway's
        handed = HandedRequest(
            request.request_id, tuple(request.prompt_token_ids), tuple(request.output_token_ids), sampling,
            request.num_computed_tokens, tuple(request.kv_keys), request.num_preemptions, request.cached_tokens)
        route = Route(list(request.decode_peers), request.deadline_unix_ms)
        refusal = await self.node.adopt(handed, request.cache_store, route)
        if refusal is not None:
            return decode_pb2.AdoptResponse(granted=False, reason=refusal.reason, retry_after_ms=50)
        return decode_pb2.AdoptResponse(granted=True)

    @grpc_errors
    @traced_rpc("Attach")
    async def Attach(self, request: decode_pb2.AttachRequest, context: grpc.aio.ServicerContext
                     ) -> AsyncIterator[decode_pb2.TokenEvent]:
        """The request's events after ``resume_after`` tokens (``DecodeNode.attach``). An error of the
        node's own carries ``ATTACH_FINAL`` in the trailing metadata: the gateway does not attach again
        (a broken call has no such metadata, and it does)."""
        try:
            check_request_id(request.request_id)
            async with contextlib.aclosing(self.node.attach(request.request_id, request.resume_after)) as events:
                async for event in events:  # a call that ends before the stream leaves it for a re-attach
                    yield _token_event(event)
        except mapped_errors():
            context.set_trailing_metadata(((ATTACH_FINAL, "1"),))
            raise

    @grpc_errors
    @traced_rpc("Abort")
    async def Abort(self, request: node_pb2.AbortRequest, context: grpc.aio.ServicerContext) -> node_pb2.AbortResponse:
        """A prefill-only caller must present the request's live grant token (``PERMISSION_DENIED``
        otherwise, nothing freed); a request without a live grant is not its to abort (``found = false``,
        untouched). Gateways and decode nodes abort any request."""
        check_request_id(request.request_id)
        if needs_grant_token(context):
            if not self.node.grants.live(request.request_id):
                return node_pb2.AbortResponse(found=False)
            self.node.grants.check(request.request_id, request.grant_token)
        said = "".join(c if c.isprintable() else " " for c in request.reason[:256])  # informative only: never refused
        reason = f"aborted by {said or 'a caller'}"
        return node_pb2.AbortResponse(found=await self.node.abort(request.request_id, reason))

    @grpc_errors
    @traced_rpc("OpenKVIpc")
    async def OpenKVIpc(self, request: decode_pb2.KVIpcOffer, context: grpc.aio.ServicerContext
                        ) -> decode_pb2.KVIpcAnswer:
        """Map a prefill node's KV pool by CUDA IPC if it shares this host and GPU (refusal = an answer)."""
        return answer_to_proto(self.node.ipc.open(offer_from_proto(request), owner=caller_of(context)))

    @grpc_errors
    async def NodeStatus(self, request: node_pb2.NodeStatusRequest, context: grpc.aio.ServicerContext
                         ) -> gateway_pb2.NodeStatus:
        roles = caller_roles(context)
        if request.decode_nodes and (not roles or "gateway" in roles):
            check_addresses(request.decode_nodes, "decode_nodes")
            self.node.gateway_peers.saw(request.decode_nodes)  # migration targets (peer_sightings.py)
        return await self.status()

    async def status(self) -> gateway_pb2.NodeStatus:
        """What ``NodeStatus`` answers (also read by ``/metrics``; on the event loop)."""
        engine_stats = await self.node.worker.call(LLMEngine.stats)
        status = node_status(engine_stats, "decode", self.address, not self.node.draining)
        status.metrics_url = self.metrics_url
        status.calls_in_flight = len(self.node.streams)
        return status


def _token_event(event: TokenEvent) -> decode_pb2.TokenEvent:
    message = decode_pb2.TokenEvent(token_ids=event.token_ids, finish_reason=event.finish_reason or "",
                                    moved_to=event.moved_to, abort_reason=event.abort_reason,
                                    logprobs=logprobs_to_proto(event.logprobs))
    if event.finish_reason is not None:
        message.usage.CopyFrom(gateway_pb2.Usage(prompt_tokens=event.prompt_tokens,
                                                 completion_tokens=event.completion_tokens,
                                                 cached_tokens=event.cached_tokens))
    return message


def _error_ack(seq: int, request_id: str, error: Exception) -> decode_pb2.KVAck:
    return decode_pb2.KVAck(seq=seq, request_id=request_id, error=str(error), code=status_of(error).value[0])

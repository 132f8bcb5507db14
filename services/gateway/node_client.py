"""The gateway's gRPC client edge to its nodes: the stubs, and the translation between the ``pdserve.v1``
protos and the gateway's dataclasses (``node_events``, ``nodes.NodeInfo``). Nothing past this module (and
the client-facing ``servicer``) sees a proto.

- ``Prefill`` and ``Attach`` are server streams: :func:`open_prefill` / :func:`open_attach` return a
  :class:`NodeStream` that yields ``PrefillEvent`` items / ``TokenEvent`` items; a failed call raises its
  ``grpc.aio.AioRpcError`` from the iteration, as the call itself does.
- :func:`abort` and :func:`node_status` are the unary calls every node serves (``pdserve.v1.Node``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Generic, TypeVar

import grpc.aio
from pdserve.v1 import (
    cache_store_pb2_grpc,
    decode_pb2,
    decode_pb2_grpc,
    gateway_pb2,
    node_pb2,
    prefill_pb2,
    prefill_pb2_grpc,
)

from services.common.logprobs_convert import logprob_from_proto, logprobs_from_proto
from services.common.sampling_convert import sampling_to_proto
from services.engine.sampling_params import SamplingParams
from services.gateway.node_events import (
    FirstToken,
    PrefillCall,
    PrefillDone,
    PrefillEvent,
    Refused,
    Reserved,
    TokenEvent,
)
from services.gateway.nodes import CACHE_STORE, DECODE, PREFILL, STATUS_FIELDS, NodeInfo

Metadata = Sequence[tuple[str, str]] | None

_STUBS: dict[str, Any] = {
    PREFILL: prefill_pb2_grpc.PrefillNodeStub,
    DECODE: decode_pb2_grpc.DecodeNodeStub,
    CACHE_STORE: cache_store_pb2_grpc.CacheStoreStub,
}
ROLES_WITH_STUBS = frozenset(_STUBS)


def stub_for(role: str, channel: grpc.aio.Channel) -> Any:
    """The stub of a node's own service (PrefillNode, DecodeNode or CacheStore) on ``channel``."""
    return _STUBS[role](channel)


E = TypeVar("E")


class NodeStream(Generic[E]):
    """A server-streaming call to a node, read as the gateway's events. ``cancel()`` cancels the call."""

    def __init__(self, call: Any, convert: Callable[[Any], E]) -> None:
        self._call = call  # grpc.aio.UnaryStreamCall
        self._convert = convert

    def cancel(self) -> bool:
        return bool(self._call.cancel())

    async def __aiter__(self) -> AsyncIterator[E]:
        async for message in self._call:
            yield self._convert(message)


# --- the streams ---

def prefill_request_to_proto(call: PrefillCall) -> prefill_pb2.PrefillRequest:
    return prefill_pb2.PrefillRequest(
        request_id=call.request_id, prompt_token_ids=call.prompt_ids, sampling=sampling_to_proto(call.sampling),
        decode_candidates=call.decode_candidates, deadline_unix_ms=call.deadline_unix_ms)


def prefill_event_from_proto(message: prefill_pb2.PrefillEvent) -> PrefillEvent:
    kind = message.WhichOneof("event")
    if kind == "refused":
        return Refused(message.refused.decode_address, message.refused.reason)
    if kind == "reserved":
        return Reserved(message.reserved.decode_address)
    if kind == "first_token":
        first = message.first_token
        return FirstToken(first.token_id, first.finish_reason, first.cached_tokens,
                          logprob_from_proto(first.logprob) if first.HasField("logprob") else None,
                          tuple(logprobs_from_proto(first.prompt_logprobs)))
    if kind == "done":
        return PrefillDone()
    return None


def token_event_from_proto(message: decode_pb2.TokenEvent) -> TokenEvent:
    return TokenEvent(token_ids=tuple(message.token_ids), finish_reason=message.finish_reason,
                      moved_to=message.moved_to, abort_reason=message.abort_reason,
                      logprobs=tuple(logprobs_from_proto(message.logprobs)))


def open_prefill(stub: Any, call: PrefillCall, timeout: float | None, metadata: Metadata
                 ) -> NodeStream[PrefillEvent]:
    """``PrefillNode.Prefill``: the prefill leg's stream."""
    return NodeStream(stub.Prefill(prefill_request_to_proto(call), timeout=timeout, metadata=metadata),
                      prefill_event_from_proto)


def open_attach(stub: Any, request_id: str, timeout: float | None, metadata: Metadata,
                resume_after: int = 0) -> NodeStream[TokenEvent]:
    """``DecodeNode.Attach``: a decode leg's stream, after the first ``resume_after`` tokens of the node's."""
    return NodeStream(stub.Attach(decode_pb2.AttachRequest(request_id=request_id, resume_after=resume_after),
                                  timeout=timeout, metadata=metadata), token_event_from_proto)


async def adopt_tokens(stub: Any, request_id: str, prompt_ids: Sequence[int], output_ids: Sequence[int],
                       sampling: SamplingParams, decode_peers: Sequence[str], deadline_unix_ms: int, timeout: float,
                       metadata: Metadata) -> tuple[bool, str]:
    """``DecodeNode.Adopt`` of a request as tokens only (the node recomputes its KV): (granted, reason)."""
    reply = await stub.Adopt(decode_pb2.AdoptRequest(
        request_id=request_id, prompt_token_ids=prompt_ids, output_token_ids=output_ids,
        sampling=sampling_to_proto(sampling), num_computed_tokens=0, deadline_unix_ms=deadline_unix_ms,
        from_node="gateway", decode_peers=decode_peers), timeout=timeout, metadata=metadata)
    return reply.granted, reply.reason


# --- the unary calls of every node ---

async def abort(stub: Any, request_id: str, reason: str, timeout: float, metadata: Metadata) -> bool:
    """``Abort``: whether the node held the request (and has now freed it); a failed call raises."""
    reply = await stub.Abort(node_pb2.AbortRequest(request_id=request_id, reason=reason), timeout=timeout,
                             metadata=metadata)
    return bool(reply.found)


async def embed(stub: Any, request_id: str, prompt_ids: Sequence[int], timeout: float | None,
                metadata: Metadata) -> tuple[list[float], int]:
    """A prefill node's ``Embed``: the last prompt token's final hidden state, and the cached prompt tokens."""
    reply = await stub.Embed(prefill_pb2.PrefillEmbedRequest(request_id=request_id, prompt_token_ids=prompt_ids),
                             timeout=timeout, metadata=metadata)
    return list(reply.embedding), reply.cached_tokens


def node_info_from_proto(address: str, status: gateway_pb2.NodeStatus) -> NodeInfo:
    """A node's ``NodeStatus`` as it reports itself (``role``: the role it reports, maybe empty)."""
    return NodeInfo(address=address, role=status.role, **{name: getattr(status, name) for name in STATUS_FIELDS})


async def node_status(stub: Any, address: str, timeout: float, wait_for_ready: bool = False,
                      decode_nodes: Sequence[str] = ()) -> NodeInfo:
    """``NodeStatus``: the node as it reports itself (see :func:`node_info_from_proto`); a failed call raises.
    ``wait_for_ready``: wait (within ``timeout``) for a connection rather than fail while there is none.
    ``decode_nodes``: the healthy decode nodes, told to a decode node (its migration targets)."""
    request = node_pb2.NodeStatusRequest(decode_nodes=list(decode_nodes))
    return node_info_from_proto(address, await stub.NodeStatus(request, timeout=timeout,
                                                               wait_for_ready=wait_for_ready))

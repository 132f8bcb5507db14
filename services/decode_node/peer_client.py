"""The decode node as a gRPC client of other decode nodes (handover peers): ``Adopt`` and ``Abort``.

This module translates between the handover agent's dataclasses and ``pdserve.v1`` at that edge: an
offer (:class:`~services.engine.handover.HandedRequest` and :class:`Offer`) becomes an ``AdoptRequest``,
the answer an :class:`AdoptAnswer`, and a failed call a :class:`PeerCallError`. One channel per peer,
opened on first use, closed once the peer is gone (``ChannelPool``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc.aio
from pdserve.v1 import decode_pb2, decode_pb2_grpc, node_pb2

from services.common import tracing
from services.common.channel_pool import ChannelPool
from services.common.sampling_convert import sampling_to_proto
from services.common.server import grpc_options
from services.engine.decode_role import HandedRequest


@dataclass(frozen=True)
class Offer:
    """What an ``Adopt`` tells the peer besides the request itself."""

    model_fingerprint: bytes
    cache_store: str  # where the request's KV waits (the adopter reads it there)
    from_node: str  # the offering node's address
    decode_peers: Sequence[str]  # where the request may go next, best first
    deadline_unix_ms: int = 0


@dataclass(frozen=True)
class AdoptAnswer:
    granted: bool
    reason: str = ""  # why not, when refused


class PeerCallError(Exception):
    """A call to a peer failed (unreachable, timed out, an error status)."""

    def __init__(self, code: str, details: str):
        super().__init__(f"{code}: {details}")
        self.code = code
        self.details = details


class DecodePeers:
    def __init__(self, rpc_timeout_s: float = 10.0):
        self.rpc_timeout_s = rpc_timeout_s
        self._pool = ChannelPool("decode", grpc_options())

    def _stub(self, address: str) -> decode_pb2_grpc.DecodeNodeStub:
        return self._pool.stub(address, decode_pb2_grpc.DecodeNodeStub)

    async def adopt(self, peer: str, handed: HandedRequest, offer: Offer, trace: Any = None) -> AdoptAnswer:
        """Offer ``handed`` to ``peer``; ``trace``: the trace context its spans join. Raises
        :class:`PeerCallError`."""
        request = decode_pb2.AdoptRequest(
            request_id=handed.request_id, prompt_token_ids=handed.prompt_token_ids,
            output_token_ids=handed.output_token_ids, sampling=sampling_to_proto(handed.sampling),
            model_fingerprint=offer.model_fingerprint, kv_keys=handed.kv_keys,
            num_computed_tokens=handed.num_computed_tokens, cache_store=offer.cache_store,
            deadline_unix_ms=offer.deadline_unix_ms, num_preemptions=handed.num_preemptions,
            cached_tokens=handed.cached_tokens, from_node=offer.from_node, decode_peers=list(offer.decode_peers))
        try:
            answer = await self._stub(peer).Adopt(request, timeout=self.rpc_timeout_s,
                                                  metadata=tracing.outgoing(trace))
        except grpc.aio.AioRpcError as error:
            raise PeerCallError(error.code().name, error.details() or "") from error
        return AdoptAnswer(answer.granted, answer.reason)

    async def abort(self, peer: str, request_id: str, reason: str) -> None:
        """``Abort`` ``request_id`` on ``peer``. Raises :class:`PeerCallError`."""
        try:
            await self._stub(peer).Abort(node_pb2.AbortRequest(request_id=request_id, reason=reason),
                                         timeout=self.rpc_timeout_s)
        except grpc.aio.AioRpcError as error:
            raise PeerCallError(error.code().name, error.details() or "") from error

    async def close(self) -> None:
        await self._pool.close()

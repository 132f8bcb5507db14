"""The prefill node's gRPC client of decode nodes: ``Reserve``, ``Abort``, ``OpenKVIpc`` and the
``TransferKV`` stream (``kv_sender.py``). It translates between the node's dataclasses (:class:`ReserveAsk`,
:class:`Grant`) and ``pdserve.v1.DecodeNode``'s protos; the node logic sees no proto.

Channels are pooled per address (decode nodes come and go with DNS discovery). RPC errors surface as
``grpc.aio.AioRpcError``, which ``prepare.py`` reads (status codes) to tell a full node from a missing one.
A ``Reserve`` that ran out of time before its channel ever connected (a silent port, a hung handshake or
name lookup) reached no decode node: it fails ``UNAVAILABLE``, as a refused connection does, not
``DEADLINE_EXCEEDED`` (which says a node may have granted it unseen).

Grant tokens: a decode node's grant carries a token (``grant_token``) that every later message of the
request presents — the KV stream's header, keepalives and commit (``kv_sender.py``) and the ``Abort`` of
a grant this node gives up. :class:`DecodeClients` remembers each granted token by (address, request id)
from the ``Reserve`` answer until the commit is acknowledged or the ``Abort`` is sent; tokens are never
logged. A ``Reserve`` whose answer never arrived (an ambiguous error) leaves no token: its ``Abort`` is
refused there and the grant's lease frees it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import grpc
import grpc.aio
from pdserve.v1 import decode_pb2, decode_pb2_grpc, node_pb2

from services.common import tracing
from services.common.channel_pool import ChannelPool
from services.common.kv_transfer_stats import KVTransferStats
from services.common.sampling_convert import sampling_to_proto
from services.common.server import grpc_options
from services.engine.kv_layout_spec import KVLayoutSpec
from services.engine.sampling_params import SamplingParams
from services.engine_node.kv_ipc_wire import IpcAnswer, IpcOffer, answer_from_proto, offer_to_proto
from services.engine_node.kv_layout import kv_layout
from services.prefill_node.kv_sender import KVSender

MAX_TOKENS = 1 << 16
"""Grant tokens remembered at most (a request holds one grant at a time)."""


@dataclass(frozen=True)
class ReserveAsk:
    """What the prefill node asks decode nodes to reserve for a request."""

    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams
    block_hashes: list[bytes]  # chained hashes of the prompt's full blocks (the decode node's prefix match)
    lease_ms: int
    decode_peers: list[str]  # the granting node ignores itself; the others may adopt the request later


@dataclass(frozen=True)
class Grant:
    """A decode node's answer to ``Reserve`` (the ``prepare.Answer`` the queues read)."""

    granted: bool
    reason: str = ""
    retry_after_ms: int = 0
    block_ids: tuple[int, ...] = ()  # one per prompt block; KV goes to block_ids[num_cached_blocks:]
    num_cached_blocks: int = 0
    lease_deadline_unix_ms: int = 0  # wall clock
    lease_ms: int = 0  # the lease as a duration; 0 from an older node
    token: bytes = field(default=b"", repr=False)  # the grant's capability: never logged


def granted_lease_s(grant: Grant, asked_ms: int) -> float:
    """How long the decode node's lease holds without traffic: its ``lease_ms``; from a node that does not
    say (older), the lease asked, bounded by the deadline it named (read on this node's clock)."""
    if grant.lease_ms:
        return grant.lease_ms / 1000
    return max(0.0, min(asked_ms / 1000, grant.lease_deadline_unix_ms / 1000 - time.time()))


def _grant(answer: decode_pb2.ReserveResponse) -> Grant:
    return Grant(granted=answer.granted, reason=answer.reason, retry_after_ms=answer.retry_after_ms,
                 block_ids=tuple(answer.block_ids), num_cached_blocks=answer.num_cached_blocks,
                 lease_deadline_unix_ms=answer.lease_deadline_unix_ms, lease_ms=answer.lease_ms,
                 token=answer.grant_token)


class DecodeClients:
    """One prefill node's calls to its decode nodes. ``layout``: this node's KV layout (named in every
    ``Reserve``, IPC offer and KV stream header; made a proto here, where it goes on the wire)."""

    def __init__(self, layout: KVLayoutSpec):
        self.layout = layout
        self._wire_layout = kv_layout(layout)
        self._channels = ChannelPool("decode", grpc_options())
        self._tokens: dict[tuple[str, str], bytes] = {}  # (address, request id) → its live grant's token

    def stub(self, address: str) -> decode_pb2_grpc.DecodeNodeStub:
        return self._channels.stub(address, decode_pb2_grpc.DecodeNodeStub)

    async def close(self) -> None:
        await self._channels.close()

    def reserve_call(self, ask: ReserveAsk) -> Callable[[str, float], Awaitable[Grant]]:
        """``call(address, rpc_timeout_s)``: one ``Reserve`` of ``ask`` on that node (``prepare.ReserveCall``)."""
        layout = self.layout
        message = decode_pb2.ReserveRequest(
            request_id=ask.request_id, prompt_token_ids=ask.prompt_ids, max_tokens=ask.sampling.max_tokens,
            block_hashes=ask.block_hashes, lease_ms=ask.lease_ms, sampling=sampling_to_proto(ask.sampling),
            model_fingerprint=layout.model_fingerprint, layout=self._wire_layout, decode_peers=ask.decode_peers)

        async def call(address: str, rpc_timeout_s: float) -> Grant:
            channel = self._channels.channel(address)
            try:
                answer = await decode_pb2_grpc.DecodeNodeStub(channel).Reserve(
                    message, timeout=rpc_timeout_s, metadata=tracing.outgoing())
            except grpc.aio.AioRpcError as error:
                state = channel.get_state()
                if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED and state != grpc.ChannelConnectivity.READY:
                    raise grpc.aio.AioRpcError(
                        grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(),
                        details=f"not connected before the deadline (channel {state.name}): {error.details()}",
                    ) from error
                raise
            grant = _grant(answer)
            if grant.granted:
                self._remember(address, ask.request_id, grant.token)
            return grant

        return call

    async def abort(self, address: str, request_id: str, reason: str) -> None:
        """Abort the request on that decode node (``reason`` is prefixed "the prefill node: "); an
        unreachable node is let be (its lease frees the reservation)."""
        token = self._tokens.pop((address, request_id), b"")
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.TimeoutError):
            await self.stub(address).Abort(
                node_pb2.AbortRequest(request_id=request_id, reason=f"the prefill node: {reason}", grant_token=token),
                timeout=2.0, metadata=tracing.outgoing())

    def _remember(self, address: str, request_id: str, token: bytes) -> None:
        if len(self._tokens) >= MAX_TOKENS:  # only a leak could fill it (every grant is committed or aborted)
            del self._tokens[next(iter(self._tokens))]
        self._tokens[address, request_id] = token

    async def offer_ipc(self, address: str, offer: IpcOffer) -> IpcAnswer:
        """``OpenKVIpc``: offer this process's pool by CUDA IPC (``kv_ipc.py``)."""
        answer = await self.stub(address).OpenKVIpc(offer_to_proto(offer), timeout=10.0,
                                                    metadata=tracing.outgoing())
        return answer_from_proto(answer)

    def kv_sender(self, address: str, request_id: str, grant: Grant, stats: KVTransferStats) -> KVSender:
        """The ``TransferKV`` stream of a granted request (opened by ``KVSender.open``)."""
        token = grant.token or self._tokens.get((address, request_id), b"")
        return KVSender(self.stub(address), request_id, self._wire_layout, list(grant.block_ids), address, stats,
                        grant_token=token, on_committed=lambda: self._tokens.pop((address, request_id), None))

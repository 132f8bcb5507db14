"""Scriptable fake prefill and decode nodes (grpc.aio servers on 127.0.0.1:0) for the gateway's tests.

Each fake records what the gateway asked of it. A test sets ``script`` to an async generator function
``(request, context) -> events`` to decide what the node answers; the defaults are a well-behaved node.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc.aio
from pdserve.v1 import decode_pb2, decode_pb2_grpc, gateway_pb2, node_pb2, prefill_pb2, prefill_pb2_grpc

from services.common.server import NodeServer, ServiceBinding
from services.common.stream_close import ATTACH_FINAL

Script = Callable[[Any, grpc.aio.ServicerContext], AsyncIterator[Any]]


class FakeNode:
    role = ""

    def __init__(self) -> None:
        self.address = ""
        self.status = gateway_pb2.NodeStatus(role=self.role, healthy=True, blocks_total=100, blocks_free=100)
        self.aborts: list[str] = []
        self.aborts_answered: list[str] = []
        self.abort_delay_s = 0.0  # a node slow (or hung) to answer Abort
        self.cancelled: list[str] = []  # request ids whose stream call the gateway cancelled
        self.server: NodeServer | None = None

    async def Abort(self, request: node_pb2.AbortRequest, context: grpc.aio.ServicerContext) -> node_pb2.AbortResponse:
        self.aborts.append(request.request_id)
        await asyncio.sleep(self.abort_delay_s)
        self.aborts_answered.append(request.request_id)
        return node_pb2.AbortResponse(found=True)

    async def NodeStatus(self, request: node_pb2.NodeStatusRequest, context: grpc.aio.ServicerContext
                         ) -> gateway_pb2.NodeStatus:
        status = gateway_pb2.NodeStatus()
        status.CopyFrom(self.status)
        status.address = self.address
        return status

    async def _stream(self, script: Script, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        try:
            async for event in script(request, context):
                yield event
        except asyncio.CancelledError:
            self.cancelled.append(request.request_id)
            raise

    def binding(self) -> ServiceBinding:
        raise NotImplementedError

    async def start(self, port: int = 0) -> str:
        self.server = NodeServer([self.binding()], listen=f"127.0.0.1:{port}", grace_s=0)
        await self.server.start()
        self.address = self.server.address
        return self.address

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.shutdown()
            self.server = None


class FakePrefill(FakeNode, prefill_pb2_grpc.PrefillNodeServicer):
    """By default: reserved on the first candidate, then ``first_token``, then done."""

    role = "prefill"

    def __init__(self, first_token: int = 0, cached_tokens: int = 0) -> None:
        super().__init__()
        self.requests: list[prefill_pb2.PrefillRequest] = []
        self.first_token = first_token
        self.cached_tokens = cached_tokens
        self.first_finish_reason = ""
        self.first_logprob: gateway_pb2.TokenLogprob | None = None
        self.prompt_logprobs: list[gateway_pb2.TokenLogprob] = []
        self.script: Script = self.well_behaved
        self.embed_requests: list[prefill_pb2.PrefillEmbedRequest] = []
        # Embed's answer (its state: 0.0, 1.0, ... for each prompt token), or what it raises; a test replaces it
        self.embed_answer: Callable[[prefill_pb2.PrefillEmbedRequest, grpc.aio.ServicerContext], Any] = \
            self.embed_as_positions

    async def well_behaved(self, request: prefill_pb2.PrefillRequest, context: Any) -> AsyncIterator[Any]:
        yield prefill_pb2.PrefillEvent(reserved=prefill_pb2.Reserved(decode_address=request.decode_candidates[0]))
        yield prefill_pb2.PrefillEvent(first_token=prefill_pb2.FirstToken(
            token_id=self.first_token, cached_tokens=self.cached_tokens, finish_reason=self.first_finish_reason,
            logprob=self.first_logprob, prompt_logprobs=self.prompt_logprobs))
        yield prefill_pb2.PrefillEvent(done=prefill_pb2.Done(num_computed_tokens=len(request.prompt_token_ids)))

    async def Prefill(self, request: prefill_pb2.PrefillRequest, context: grpc.aio.ServicerContext
                      ) -> AsyncIterator[prefill_pb2.PrefillEvent]:
        self.requests.append(request)
        async for event in self._stream(self.script, request, context):
            yield event

    async def embed_as_positions(self, request: prefill_pb2.PrefillEmbedRequest, context: Any
                                 ) -> prefill_pb2.PrefillEmbedResponse:
        return prefill_pb2.PrefillEmbedResponse(embedding=[float(i) for i in range(len(request.prompt_token_ids))],
                                                cached_tokens=self.cached_tokens)

    async def Embed(self, request: prefill_pb2.PrefillEmbedRequest, context: grpc.aio.ServicerContext
                    ) -> prefill_pb2.PrefillEmbedResponse:
        self.embed_requests.append(request)
        try:
            return await self.embed_answer(request, context)
        except asyncio.CancelledError:
            self.cancelled.append(request.request_id)
            raise

    def binding(self) -> ServiceBinding:
        return ServiceBinding(prefill_pb2.DESCRIPTOR.services_by_name["PrefillNode"], self,
                              prefill_pb2_grpc.add_PrefillNodeServicer_to_server)


class FakeDecode(FakeNode, decode_pb2_grpc.DecodeNodeServicer):
    """By default: ``tokens`` in one event with ``finish_reason = "length"``."""

    role = "decode"

    def __init__(self, tokens: tuple[int, ...] = ()) -> None:
        super().__init__()
        self.attaches: list[str] = []
        self.resume_after: list[int] = []  # each Attach's
        self.tokens = tokens
        self.script: Script = self.well_behaved
        self.hold = asyncio.Event()  # scripts that stall wait on it

    async def well_behaved(self, request: decode_pb2.AttachRequest, context: Any) -> AsyncIterator[Any]:
        yield decode_pb2.TokenEvent(token_ids=self.tokens, finish_reason="length")

    async def Attach(self, request: decode_pb2.AttachRequest, context: grpc.aio.ServicerContext
                     ) -> AsyncIterator[decode_pb2.TokenEvent]:
        self.attaches.append(request.request_id)
        self.resume_after.append(request.resume_after)
        # as a real decode node: an error it ends the call with is final (a script that breaks the call
        # on purpose clears this)
        context.set_trailing_metadata(((ATTACH_FINAL, "1"),))
        async for event in self._stream(self.script, request, context):
            yield event

    def binding(self) -> ServiceBinding:
        return ServiceBinding(decode_pb2.DESCRIPTOR.services_by_name["DecodeNode"], self,
                              decode_pb2_grpc.add_DecodeNodeServicer_to_server)


async def eventually(predicate: Callable[[], bool], timeout_s: float = 3.0, what: str = "condition") -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{what} not reached within {timeout_s}s")
        await asyncio.sleep(0.01)

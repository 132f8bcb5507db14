"""Bytes that are not a method's request message: a handler that refuses them (``@grpc_errors``) answers
INVALID_ARGUMENT naming the method; any other handler never receives what could not be read (grpc's own
UNKNOWN), never an ``UnparsableRequest`` it would mistake for a request. Real gRPC on loopback."""

from __future__ import annotations

import grpc
import grpc.aio
import pytest
from pdserve.v1 import gateway_pb2, gateway_pb2_grpc

from services.common.errors import grpc_errors
from services.common.server import NodeServer, ServiceBinding
from services.common.tls.channels import open_channel

CORRUPT = b"\xff\xff\xff\xff\xff"


class HalfDecorated(gateway_pb2_grpc.GatewayServicer):
    def __init__(self) -> None:
        self.seen: list[object] = []

    @grpc_errors
    async def ClusterStatus(self, request, context):
        self.seen.append(request)
        return gateway_pb2.ClusterStatusResponse()

    async def Generate(self, request, context):  # no @grpc_errors: it does not check what it is given
        self.seen.append(request)
        yield gateway_pb2.GenerateResponse()


@pytest.fixture
async def server():
    servicer = HalfDecorated()
    binding = ServiceBinding(gateway_pb2.DESCRIPTOR.services_by_name["Gateway"], servicer,
                             gateway_pb2_grpc.add_GatewayServicer_to_server)
    node = NodeServer([binding], listen="127.0.0.1:0", grace_s=0)
    await node.start()
    yield node, servicer
    await node.shutdown()


async def test_only_handlers_that_refuse_unparsable_requests_are_given_them(server):
    node, servicer = server
    async with open_channel(node.address, "gateway") as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await channel.unary_unary("/pdserve.v1.Gateway/ClusterStatus")(CORRUPT, timeout=5)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.details().startswith("request: the bytes sent to /pdserve.v1.Gateway/ClusterStatus")
        with pytest.raises(grpc.aio.AioRpcError) as unread:
            async for _ in channel.unary_stream("/pdserve.v1.Gateway/Generate")(CORRUPT, timeout=5):
                pass
        assert unread.value.code() == grpc.StatusCode.UNKNOWN and "DecodeError" in unread.value.details()
        assert servicer.seen == []
        await channel.unary_unary("/pdserve.v1.Gateway/ClusterStatus")(b"", timeout=5)  # parses: served
    assert servicer.seen == [gateway_pb2.ClusterStatusRequest()]

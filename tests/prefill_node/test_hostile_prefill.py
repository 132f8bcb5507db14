"""A buggy or hostile caller's ``Prefill`` and ``Abort``: a malformed request id, a token id outside the
vocabulary or malformed decode candidates are refused INVALID_ARGUMENT naming the field before anything
runs or any decode node is called; both nodes stay idle and serve a normal request after. Real gRPC on
loopback (the prefill servicer and the decode node), a tiny random model on the CPU."""

from __future__ import annotations

import grpc
import grpc.aio
import pytest
from pdserve.v1 import node_pb2, prefill_pb2, prefill_pb2_grpc

from services.common.sampling_convert import sampling_to_proto
from services.common.server import NodeServer, ServiceBinding
from services.common.tls.channels import open_channel
from services.decode_node.node import DecodeNode
from services.prefill_node.node import PrefillNode
from services.prefill_node.servicer import PrefillNodeServicer
from tests.prefill_node.node_pair import GREEDY, PROMPT, engine, generate, idle, serving


async def test_malformed_prefill_and_abort_fields_are_refused_by_name(model, expected):
    decode, prefill = DecodeNode(engine(model), default_lease_s=30), PrefillNode(engine(model))
    binding = ServiceBinding(prefill_pb2.DESCRIPTOR.services_by_name["PrefillNode"], PrefillNodeServicer(prefill),
                             prefill_pb2_grpc.add_PrefillNodeServicer_to_server)
    server = NodeServer([binding], listen="127.0.0.1:0", grace_s=0)
    await server.start()
    try:
        async with serving(prefill, decode) as address, open_channel(server.address, "prefill") as channel:
            stub = prefill_pb2_grpc.PrefillNodeStub(channel)
            good = dict(request_id="r", prompt_token_ids=PROMPT, sampling=sampling_to_proto(GREEDY),
                        decode_candidates=[address])
            cases = (
                ("request_id", dict(request_id="x" * 257)), ("request_id", dict(request_id="a\nb")),
                ("token_ids", dict(prompt_token_ids=[*PROMPT[:-1], model.config.vocab_size])),
                ("decode_candidates", dict(decode_candidates=[])),
                ("decode_candidates[1]", dict(decode_candidates=[address, "host:99999"])),
                ("decode_candidates", dict(decode_candidates=[address] * 65)),
            )
            for field, bad in cases:
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.Prefill(prefill_pb2.PrefillRequest(**{**good, **bad})).read()
                assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value
                assert info.value.details().startswith(f"{field}:"), info.value.details()
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.Abort(node_pb2.AbortRequest(request_id="\x00"))
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            await idle(decode)
            assert not prefill.engine.has_unfinished() and len(prefill.live) == 0
            tokens, _ = await generate(prefill, decode, address, "normal")
            assert tokens == expected
    finally:
        await server.shutdown()

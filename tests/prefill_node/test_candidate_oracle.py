"""The decode candidates a ``Prefill`` caller names are dialled as given, so what it reads back must not
tell one kind of unreachable address from another (a port scanner into the pod network otherwise): a
closed port, a port that accepts and says nothing, and an unknown host all fail ``UNAVAILABLE`` with the
same text, naming no address and nothing of gRPC's details (those are in the prefill node's log); a
candidate refused that way before a usable one shows the same reason in its ``refused`` event. The
per-address queues are gone once the requests end. Real gRPC on loopback, a tiny random model on the CPU."""

from __future__ import annotations

import re
import socket

import grpc
import grpc.aio
import pytest
from pdserve.v1 import prefill_pb2, prefill_pb2_grpc

from services.common.sampling_convert import sampling_to_proto
from services.common.server import NodeServer, ServiceBinding
from services.common.tls.channels import open_channel
from services.decode_node.node import DecodeNode
from services.prefill_node.node import PrefillNode
from services.prefill_node.prepare import UNREACHABLE
from services.prefill_node.servicer import PrefillNodeServicer
from tests.prefill_node.node_pair import GREEDY, PROMPT, engine, idle, serving
from tests.tls_identities import identity_of


async def test_unreachable_candidates_all_read_the_same_and_leave_no_queue(model):
    decode, prefill = DecodeNode(engine(model), default_lease_s=30), PrefillNode(engine(model))
    binding = ServiceBinding(prefill_pb2.DESCRIPTOR.services_by_name["PrefillNode"], PrefillNodeServicer(prefill),
                             prefill_pb2_grpc.add_PrefillNodeServicer_to_server)
    server = NodeServer([binding], listen="127.0.0.1:0", grace_s=0)
    await server.start()
    silent = socket.socket()  # accepts connections (the kernel's backlog) and never says a thing
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()
    targets = {"closed": f"127.0.0.1:{closed_port}", "silent": f"127.0.0.1:{silent.getsockname()[1]}",
               "unknown host": "no-such-host.invalid:50051"}

    def request(*candidates: str) -> prefill_pb2.PrefillRequest:
        return prefill_pb2.PrefillRequest(request_id="probe", prompt_token_ids=PROMPT,
                                          sampling=sampling_to_proto(GREEDY), decode_candidates=candidates)

    try:
        async with serving(prefill, decode) as address, \
                open_channel(server.address, "prefill", identity=identity_of("gateway")) as channel:
            stub = prefill_pb2_grpc.PrefillNodeStub(channel)
            answers = {}
            for label, target in targets.items():
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.Prefill(request(target), timeout=2.0).read()
                answers[label] = (info.value.code(), info.value.details())
            assert len(set(answers.values())) == 1, answers  # one code, one text, whatever the address
            code, details = answers["closed"]
            assert code == grpc.StatusCode.UNAVAILABLE  # the gateway starts such a request over elsewhere
            assert UNREACHABLE in details and not re.search(r"127\.0\.0\.1|:\d+|invalid", details), details
            for word in ("refused", "connect", "deadline", "resolv", "domain", "unimplemented"):
                assert word not in details.lower(), details
            assert not prefill.prepare._queues, list(prefill.prepare._queues)

            # an unreachable candidate before a usable one: its refused event says no more
            events = [event async for event in stub.Prefill(request(targets["closed"], address), timeout=20.0)]
            refused = [event.refused for event in events if event.HasField("refused")]
            assert [(r.decode_address, r.reason) for r in refused] == [(targets["closed"], UNREACHABLE)]
            assert events[-1].HasField("done")
            async for _ in decode.attach("probe"):  # the request ends on its decode node
                pass
            await idle(decode)
            assert not prefill.prepare._queues, list(prefill.prepare._queues)
    finally:
        silent.close()
        await server.shutdown()

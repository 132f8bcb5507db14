"""A prefill node and a decode node in one process, the decode node served over real gRPC on loopback, a
tiny random model on the CPU: the harness of the tests that run a request from prefill to decode."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator

from pdserve.v1 import decode_pb2, decode_pb2_grpc

from services.common.server import NodeServer, ServiceBinding
from services.decode_node.node import DecodeNode
from services.decode_node.servicer import DecodeNodeServicer
from services.engine.sampling_params import SamplingParams
from services.prefill_node.node import Done, FirstToken, PrefillNode
from tests.conftest import make_engine

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
PROMPT = [(7 * i + 3) % 500 + 5 for i in range(45)]  # 3 prefill chunks of 16, 12 blocks of 4


def engine(model):
    return make_engine(model, None, num_kv_blocks=64, max_num_batched_tokens=16, block_size=4)


@contextlib.asynccontextmanager
async def serving(prefill: PrefillNode, decode: DecodeNode) -> AsyncIterator[str]:
    """Serve ``decode``, start both nodes, yield the decode node's address; stop everything after."""
    binding = ServiceBinding(decode_pb2.DESCRIPTOR.services_by_name["DecodeNode"], DecodeNodeServicer(decode),
                             decode_pb2_grpc.add_DecodeNodeServicer_to_server)
    server = NodeServer([binding], listen="127.0.0.1:0", grace_s=0)
    await server.start()
    decode.address = server.address
    decode.start()
    prefill.start()
    try:
        yield server.address
    finally:
        await prefill.stop()
        await decode.stop()
        await server.shutdown()


@contextlib.asynccontextmanager
async def pair(model, lease_s: float, prefix_store=None) -> AsyncIterator[tuple[PrefillNode, DecodeNode, str]]:
    """A plain pair (bytes over the KV stream) whose decode node grants ``lease_s`` leases, serving."""
    decode = DecodeNode(engine(model), default_lease_s=lease_s)
    prefill = PrefillNode(engine(model), prefix_store=prefix_store)
    async with serving(prefill, decode) as address:
        yield prefill, decode, address


async def generate(prefill: PrefillNode, decode: DecodeNode, address: str, request_id: str) -> tuple[list[int], Done]:
    events = [e async for e in prefill.prefill(request_id, PROMPT, GREEDY, [address], timeout_s=30)]
    first = next(e for e in events if isinstance(e, FirstToken))
    tokens = [first.token_id]
    async for event in decode.attach(request_id):
        tokens += event.token_ids
    return tokens, next(e for e in events if isinstance(e, Done))


async def idle(decode: DecodeNode) -> None:
    engine = decode.engine
    await decode.worker.call(lambda e: None)  # the last step's bookkeeping is done
    assert not engine.reservations.reservations and not engine.has_unfinished()
    assert engine.kv.num_free_blocks == engine.kv.num_blocks
    engine.check_integrity()


def slow_steps(node: PrefillNode | DecodeNode, seconds: float) -> None:
    """Every model step of ``node`` takes ``seconds`` longer (the engine thread sleeps before it runs)."""
    execute = node.engine.execute_step

    def slow_step(planned):
        time.sleep(seconds)
        return execute(planned)

    node.engine.execute_step = slow_step

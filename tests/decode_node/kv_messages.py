"""Messages of a hand-written prefill peer to a decode node (``TransferKV``, ``Reserve``), for the tests
that play a buggy or hostile one: builders, and a stream that numbers its messages and returns the acks."""

from __future__ import annotations

from pdserve.v1 import decode_pb2, node_pb2

from services.common.sampling_convert import sampling_to_proto
from tests.prefill_node.node_pair import GREEDY, PROMPT

Message = decode_pb2.KVTransferMessage


def reserve(rid: str = "good", **fields) -> decode_pb2.ReserveRequest:
    values = dict(request_id=rid, prompt_token_ids=PROMPT, max_tokens=GREEDY.max_tokens,
                  sampling=sampling_to_proto(GREEDY))
    return decode_pb2.ReserveRequest(**{**values, **fields})


def header(rid: str, layout: node_pb2.KVLayout, token: bytes = b"", ipc_session: str = "") -> Message:
    return Message(header=decode_pb2.KVHeader(request_id=rid, layout=layout, grant_token=token,
                                              ipc_session=ipc_session))


def blocks(rid: str, ids: list[int], payload: bytes) -> Message:
    return Message(blocks=decode_pb2.KVBlockBatch(request_id=rid, block_ids=ids, payload=payload))


def keepalive(rid: str, token: bytes = b"") -> Message:
    return Message(keepalive=decode_pb2.KVKeepAlive(request_id=rid, grant_token=token))


def commit(rid: str, token: bytes = b"", first_token_id: int = 1, num_computed_tokens: int = 0) -> Message:
    return Message(commit=decode_pb2.KVCommit(request_id=rid, first_token_id=first_token_id,
                                              num_computed_tokens=num_computed_tokens, grant_token=token))


async def transfer(stub, *messages: Message, seqs: list[int] | None = None) -> list[decode_pb2.KVAck]:
    """Send ``messages`` on one stream (numbered 1, 2, … unless ``seqs``) and return every ack."""
    async def send():
        for seq, message in zip(seqs or range(1, len(messages) + 1), messages, strict=True):
            message.seq = seq
            yield message

    return [ack async for ack in stub.TransferKV(send())]

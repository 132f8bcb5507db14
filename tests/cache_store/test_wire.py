"""Hand-framed chunks are protobuf's own wire format, both ways; both servicer bindings serve both clients."""

from __future__ import annotations

import os

import pytest
from google.protobuf.message import DecodeError
from pdserve.v1 import cache_store_pb2, cache_store_pb2_grpc

from services.cache_store.client import AsyncCacheStoreClient
from services.cache_store.servicer import CacheStoreServicer, add_to_server
from services.cache_store.store import BlockStore
from services.cache_store.wire import (
    END_OF_PUT,
    BlockAssembler,
    encode_chunk,
    parse_get_frame,
    parse_put_frame,
    put_chunks,
    put_frames,
    split_data,
)
from services.common.server import NodeServer, ServiceBinding
from services.common.tls.channels import open_channel
from tests.cache_store.helpers import key, layout


def test_put_frames_are_what_protobuf_would_serialize():
    data = os.urandom(5000)
    frames = list(put_frames([(key("a"), data), (key("b"), b"xy")], layout(), chunk_bytes=2048))
    messages = [cache_store_pb2.PutChunk.FromString(frame) for frame in frames]
    assert [m.key for m in messages] == [key("a"), b"", b"", key("b"), b""]
    assert [m.end_of_put for m in messages] == [False] * 4 + [True]  # the last chunk ends the put, alone
    assert frames[-1] == END_OF_PUT and not messages[-1].data
    assert b"".join(m.data for m in messages[:3]) == data
    assert messages[0].layout == layout() and messages[0].total_length == 5000
    for frame, message in zip(frames, messages, strict=True):
        assert frame == message.SerializeToString()
    assert [m.data for m in put_chunks([(key("b"), b"xy")], layout())] == [b"xy", b""]


def test_split_data_takes_data_from_anywhere_and_keeps_the_rest():
    header = cache_store_pb2.GetChunk(key=key("a"), total_length=3).SerializeToString()
    last = encode_chunk(header, b"abc")
    first = encode_chunk(b"", b"zzz") + header + encode_chunk(b"", b"abc")  # data twice: the last one wins
    for raw in (last, first):
        frame = parse_get_frame(raw)
        assert (frame.message.key, frame.message.total_length, frame.message.data) == (key("a"), 3, b"")
        assert bytes(frame.data) == b"abc"
    assert split_data(b"") == (b"", memoryview(b""))
    for broken in (last[:-1], last + b"\x0a", bytes([0x33])):  # short data, a field cut off, a group tag
        with pytest.raises(DecodeError):
            parse_put_frame(broken)


def test_block_assembler_takes_messages_and_frames():
    data = os.urandom(3000)
    blocks_frames = list(put_frames([(key("a"), data)], layout(), chunk_bytes=1000))[:-1]  # not END_OF_PUT
    frames = [parse_get_frame(f) for f in blocks_frames]
    for chunks in (frames, [cache_store_pb2.GetChunk(key=f.message.key, total_length=f.message.total_length,
                                                     checksum_algorithm=f.message.checksum_algorithm,
                                                     checksum=f.message.checksum, data=bytes(f.data))
                            for f in frames]):
        assembler = BlockAssembler()
        assert [assembler.add(chunk) for chunk in chunks] == [None, None, None]
        assert assembler.finish() == (key("a"), data)


@pytest.mark.parametrize("adder", [add_to_server, cache_store_pb2_grpc.add_CacheStoreServicer_to_server])
async def test_both_bindings_serve_the_clients_and_the_generated_stub(adder):
    servicer = CacheStoreServicer(BlockStore(16 << 20), chunk_bytes=1 << 20)
    server = NodeServer([ServiceBinding(cache_store_pb2.DESCRIPTOR.services_by_name["CacheStore"], servicer, adder)],
                        listen="127.0.0.1:0", grace_s=0)
    await server.start()
    try:
        blocks = [(key("big"), os.urandom(3 << 20)), (key("small"), b"s" * 100)]
        client = AsyncCacheStoreClient(server.address, layout())
        assert (await client.put(blocks)).num_stored == 2
        assert await client.get([key("big"), key("small")]) == [data for _, data in blocks]
        assert await client.lookup([key("small"), key("nope")]) == 1
        await client.close()
        async with open_channel(server.address, "cache-store") as channel:
            stub = cache_store_pb2_grpc.CacheStoreStub(channel)
            chunks = [c async for c in stub.Get(cache_store_pb2.GetRequest(keys=[key("big")]))]
            assert [len(c.data) for c in chunks] == [1 << 20] * 3 and chunks[0].layout == layout()
    finally:
        await server.shutdown()

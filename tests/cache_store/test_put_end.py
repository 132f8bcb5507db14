"""A put is stored only when its stream's last chunk says it ended (``end_of_put``): an asyncio client that
cancels its put between blocks reaches the server as an ordinary end of stream, and before the marker
existed the blocks already sent were stored although the README promises a cut put stores nothing. The
clients say so in the call's metadata (``PUT_END_METADATA``); a put without it, from a node of a version
before the marker (a rolling update), is stored as before."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from pdserve.v1 import cache_store_pb2

from services.cache_store.store import BlockStore
from services.cache_store.wire import PUT_END_METADATA
from services.common.tls.channels import open_channel
from tests.cache_store.helpers import END, key, put_stream
from tests.cache_store.test_call_bounds import BLOCK, data, serving, stub_of
from tests.gateway.fakes import eventually
from tests.tls_identities import identity_of

ENDS = (PUT_END_METADATA,)


def whole_blocks(*names: str) -> list[cache_store_pb2.PutChunk]:
    return list(put_stream([(key(name), data(name)) for name in names], chunk_bytes=BLOCK // 4, end=False))


async def test_a_put_cancelled_between_whole_blocks_stores_nothing_and_gives_its_staging_back():
    store = BlockStore(8 * BLOCK)
    async with serving(store) as servicer, \
            open_channel(servicer.address, "cache-store", identity=identity_of("decode")) as channel:
        stub = stub_of(channel)
        never = asyncio.Event()

        async def two_blocks_then_wait():
            for chunk in whole_blocks("a0", "a1"):
                yield chunk
            await never.wait()

        call = stub.Put(two_blocks_then_wait(), metadata=ENDS)
        await eventually(lambda: store.put_budget.staged_bytes == 2 * BLOCK, 5, "both blocks are staged")
        call.cancel()
        await eventually(lambda: servicer.in_flight == 0 and store.put_budget.staged_bytes == 0, 5,
                         "the cut put is released")
        assert len(store) == 0
        # the same blocks, ended: stored
        assert (await stub.Put(put_stream([(key("a0"), data("a0")), (key("a1"), data("a1"))]),
                               metadata=ENDS)).num_stored == 2


async def test_a_stream_without_its_end_or_with_a_chunk_after_it_is_refused_naming_end_of_put():
    store = BlockStore(8 * BLOCK)
    async with serving(store) as servicer, \
            open_channel(servicer.address, "cache-store", identity=identity_of("prefill")) as channel:
        stub = stub_of(channel)
        with pytest.raises(grpc.RpcError) as unended:
            await stub.Put(iter(whole_blocks("b0", "b1")), metadata=ENDS)
        assert unended.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "end_of_put: the stream ended without a chunk that sets it" in unended.value.details()
        with pytest.raises(grpc.RpcError) as after:
            await stub.Put(iter([*whole_blocks("c0"), END, *whole_blocks("c1")]), metadata=ENDS)
        assert after.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "a chunk after the one that ended the put" in after.value.details()
        assert len(store) == 0 and store.put_budget.staged_bytes == 0
        # the marker may ride on the last data chunk
        chunks = whole_blocks("d0")
        chunks[-1].end_of_put = True
        assert (await stub.Put(iter(chunks), metadata=ENDS)).num_stored == 1
        assert (await stub.Put(iter([END]), metadata=ENDS)).num_stored == 0  # an empty put, ended
        store.check_integrity()


async def test_a_put_from_a_client_before_the_marker_is_stored_as_before():
    store = BlockStore(8 * BLOCK)
    async with serving(store) as servicer, \
            open_channel(servicer.address, "cache-store", identity=identity_of("prefill")) as channel:
        stub = stub_of(channel)
        assert (await stub.Put(iter(whole_blocks("o0", "o1")))).num_stored == 2  # no metadata, no marker
        assert len(store) == 2


async def test_the_client_ends_its_puts_and_says_so(monkeypatch):
    from services.cache_store import client as client_module
    from tests.cache_store.helpers import layout

    store = BlockStore(8 * BLOCK)
    async with serving(store) as servicer:
        client = client_module.AsyncCacheStoreClient(servicer.address, layout())
        try:
            assert (await client.put([(key("n0"), data("n0"))])).num_stored == 1
            whole = client_module.put_frames
            monkeypatch.setattr(client_module, "put_frames", lambda *a: list(whole(*a))[:-1])  # the marker lost
            with pytest.raises(grpc.RpcError) as cut:
                await client.put([(key("n1"), data("n1"))])
            assert cut.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # the client's metadata said it ends
        finally:
            await client.close()
        assert key("n0") in store and key("n1") not in store

"""Reading an adopted request's KV from the cache-store a handing node names: a store that cannot be reached
is reported in one text whatever the cause (a refused connection, a port that accepts and says nothing), so
an ``Adopt`` naming arbitrary addresses cannot tell open ports from closed ones, and no client is kept for it.
Real sockets on loopback, no model."""

from __future__ import annotations

import socket

import pytest

from services.common.errors import UnavailableError
from services.decode_node.kv_stores import KVStores
from services.engine.kv_layout_spec import KVLayoutSpec


def _layout() -> KVLayoutSpec:
    import torch

    from services.engine.random_llama import PRESETS, random_model
    from tests.conftest import make_engine

    model = random_model(PRESETS["tiny"], torch.float32)
    return make_engine(model, None, num_kv_blocks=8, block_size=4).kv_layout_spec()


async def _failure(stores: KVStores, address: str) -> str:
    with pytest.raises(UnavailableError) as info:
        await stores.fetch(address, [bytes(32)])
    return str(info.value).replace(address, "ADDRESS")


async def test_a_closed_and_a_silent_port_read_the_same_and_leave_no_client() -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    closed_address = f"127.0.0.1:{closed.getsockname()[1]}"
    closed.close()  # nothing listens there now
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()  # accepts (the kernel completes the handshake) and never answers
    stores = KVStores(_layout())
    try:
        original = stores._client

        def short_client(address):  # as the node's, with a short deadline
            client = original(address)
            client.timeout_s = 1.0
            return client

        stores._client = short_client
        refused = await _failure(stores, closed_address)
        silent_text = await _failure(stores, f"127.0.0.1:{silent.getsockname()[1]}")
        assert refused == silent_text == "cache-store ADDRESS: unreachable"
        assert stores.clients == {}
    finally:
        silent.close()
        await stores.close()

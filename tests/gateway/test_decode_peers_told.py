"""The gateway's status poll of a decode node names the other decode nodes it counts healthy
(``NodeStatusRequest.decode_nodes``): a draining decode node migrates to them, a node that joined after a
request started included. Prefill nodes and cache-stores are told nothing."""

from __future__ import annotations

import grpc
import pytest

from services.gateway import node_client
from services.gateway.directory import NodeDirectory
from services.gateway.nodes import CACHE_STORE, DECODE, PREFILL, NodeInfo

P, D1, D2, D3, S = (f"127.0.0.1:{port}" for port in range(1, 6))
ROLES = [(P, PREFILL), (D1, DECODE), (D2, DECODE), (D3, DECODE), (S, CACHE_STORE)]


class _Down(grpc.aio.AioRpcError):
    def __init__(self):
        super().__init__(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "connection refused")


@pytest.fixture
def told(monkeypatch) -> dict[str, list[str]]:
    told: dict[str, list[str]] = {}
    down = {D3}

    async def node_status(stub, address: str, timeout: float, wait_for_ready: bool = False,
                          decode_nodes=()) -> NodeInfo:
        told[address] = list(decode_nodes)
        if address in down:
            raise _Down()
        return NodeInfo(address, dict(ROLES)[address], healthy=True, blocks_total=10, blocks_free=10)

    monkeypatch.setattr(node_client, "node_status", node_status)
    told["down"] = down  # type: ignore[assignment]
    return told


async def test_a_decode_node_is_told_the_other_healthy_decode_nodes(told):
    directory = NodeDirectory(ROLES)
    try:
        await directory.refresh()  # the first round knows nobody healthy yet
        await directory.refresh()
        assert sorted(told[D1]) == [D2] and sorted(told[D2]) == [D1], "not itself, not the one down"
        assert sorted(told[D3]) == [D1, D2]
        assert told[P] == [] and told[S] == []
        told["down"].clear()  # d3 came up: named from the next round on
        await directory.refresh()
        await directory.refresh()
        assert sorted(told[D1]) == [D2, D3]
    finally:
        await directory.close()

"""The gateway leaves out model nodes whose deterministic mode differs from its own ``--deterministic``:
unhealthy, saying both modes, never routed to; ``ClusterStatus`` shows each node's mode. No processes: the
directory polls ``NodeStatus`` protos handed to it in place of the rpc."""

from __future__ import annotations

import pytest
import structlog
from pdserve.v1 import gateway_pb2

from services.common.config import build_config
from services.gateway import node_client
from services.gateway.config import GatewayConfig
from services.gateway.directory import NodeDirectory
from services.gateway.mode_check import MISMATCH, with_mode_check
from services.gateway.nodes import CACHE_STORE, DECODE, PREFILL, NodeInfo
from services.gateway.router import Router
from services.gateway.servicer import node_status_to_proto

ON_WANTED_OFF = ("deterministic mode: the node runs on, this gateway expects off (--deterministic); start the "
                 "gateway and every node in one mode")


def node(address: str, role: str, deterministic: bool, healthy: bool = True) -> NodeInfo:
    return NodeInfo(address, role, healthy=healthy, deterministic=deterministic, blocks_total=100, blocks_free=100)


def test_a_node_of_the_other_mode_is_unhealthy_naming_both_modes():
    nodes = [node("p1", PREFILL, False), node("p2", PREFILL, True), node("d1", DECODE, True),
             node("d2", DECODE, False), node("s", CACHE_STORE, False)]
    marked = {n.address: n for n in with_mode_check(nodes, False)}
    assert [a for a, n in marked.items() if n.healthy] == ["p1", "d2", "s"]
    assert marked["p2"].error == marked["d1"].error == ON_WANTED_OFF
    deterministic = {n.address: n for n in with_mode_check(nodes, True)}
    assert [a for a, n in deterministic.items() if n.healthy] == ["p2", "d1", "s"]  # a cache-store has no mode
    assert deterministic["p1"].error.startswith(f"{MISMATCH}: the node runs off, this gateway expects on")


def test_a_node_down_already_keeps_its_own_reason():
    down = NodeInfo("d", DECODE, healthy=False, deterministic=True, error="UNAVAILABLE: connection refused")
    assert with_mode_check([down], False) == [down]


def test_the_setting_is_off_by_default_and_read_from_flag_or_variable():
    required = ["--prefill", "127.0.0.1:1", "--decode", "127.0.0.1:2"]
    assert build_config(GatewayConfig, required, env={}).deterministic is False
    assert build_config(GatewayConfig, [*required, "--deterministic"], env={}).deterministic is True
    assert build_config(GatewayConfig, required, env={"PDSERVE_DETERMINISTIC": "1"}).deterministic is True


STATUSES = {  # address → what the node answers NodeStatus with
    "127.0.0.1:1": gateway_pb2.NodeStatus(role=PREFILL, healthy=True, blocks_total=100, blocks_free=100),
    "127.0.0.1:2": gateway_pb2.NodeStatus(role=PREFILL, healthy=True, blocks_total=100, blocks_free=100,
                                          deterministic=True),
    "127.0.0.1:3": gateway_pb2.NodeStatus(role=DECODE, healthy=True, blocks_total=100, blocks_free=100),
    "127.0.0.1:4": gateway_pb2.NodeStatus(role=DECODE, healthy=True, blocks_total=100, blocks_free=100,
                                          deterministic=True),
}


@pytest.fixture
def answered(monkeypatch) -> dict[str, gateway_pb2.NodeStatus]:
    """Each poll gets ``STATUSES[address]`` (a copy, to change between polls) as the node's answer."""
    statuses = {address: gateway_pb2.NodeStatus(address=address) for address in STATUSES}
    for address, status in STATUSES.items():
        statuses[address].MergeFrom(status)

    async def node_status(stub, address: str, timeout: float, wait_for_ready: bool = False,
                          decode_nodes=()) -> NodeInfo:
        return node_client.node_info_from_proto(address, statuses[address])

    monkeypatch.setattr(node_client, "node_status", node_status)
    return statuses


@pytest.mark.parametrize("deterministic", [False, True])
async def test_the_directory_leaves_out_the_other_mode_and_the_router_never_picks_it(answered, deterministic):
    roles = [("127.0.0.1:1", PREFILL), ("127.0.0.1:2", PREFILL), ("127.0.0.1:3", DECODE), ("127.0.0.1:4", DECODE)]
    directory = NodeDirectory(roles, deterministic=deterministic)
    try:
        with structlog.testing.capture_logs() as logs:
            await directory.refresh()
        ours = {a for a, s in answered.items() if s.deterministic == deterministic}
        nodes = {n.address: n for n in directory.nodes()}
        assert {a for a, n in nodes.items() if n.healthy} == ours
        for address in nodes.keys() - ours:  # left out for its mode, not for the KV layout it then has
            assert nodes[address].error.startswith(MISMATCH)
            assert node_status_to_proto(nodes[address]).deterministic is not deterministic  # ClusterStatus
        assert all(node_status_to_proto(nodes[a]).deterministic is deterministic for a in ours)
        left_out = [e for e in logs if e["event"] == "node left out: its deterministic mode differs from the gateway's"]
        assert sorted(e["address"] for e in left_out) == sorted(nodes.keys() - ours)
        router = Router("load")
        for _ in range(4):
            route = router.route(directory.nodes(PREFILL), directory.nodes(DECODE))
            assert {route.prefill, *route.decode_candidates} <= ours

        other = sorted(nodes.keys() - ours)[0]
        answered[other].deterministic = deterministic  # restarted in the cluster's mode: back in rotation
        with structlog.testing.capture_logs() as logs:
            await directory.refresh()
        assert {n.address for n in directory.nodes() if n.healthy} == ours | {other}
        assert [e["address"] for e in logs if e["event"].startswith("node back in rotation")] == [other]
    finally:
        await directory.close()

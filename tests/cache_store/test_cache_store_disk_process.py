"""The disk tier in a real cache-store process: a restart serves what reached disk, a kill -9 during
write-through puts loses only the unfinished ones, a damaged file is a missing block."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from pdserve.v1 import cache_store_pb2, cache_store_pb2_grpc, node_pb2

from services.cache_store.client import CacheStoreClient
from services.common.launch import launch
from services.common.tls.channels import open_sync_channel
from tests.cache_store.helpers import key, layout, put_stream

BLOCK = 64 << 10


def start(directory: Path, *flags: str, capacity: int = 4 * BLOCK):
    return launch("services.cache_store", "--capacity-bytes", str(capacity), "--disk-dir", str(directory),
                  "--disk-capacity-bytes", str(64 * BLOCK), "--log-level", "warning", *flags)


def status(client: CacheStoreClient):
    return client._calls().stub.NodeStatus(node_pb2.NodeStatusRequest(), timeout=5)


def data(name: str) -> bytes:
    return (name.encode() * (BLOCK // len(name) + 1))[:BLOCK]


def test_a_restart_serves_every_block_that_reached_disk(tmp_path):
    names = [f"b{i}" for i in range(10)]
    with start(tmp_path) as node:
        client = CacheStoreClient(node.address, layout())
        for name in names:
            client.put([(key(name), data(name))])
        before = status(client)  # the memory tier holds 4 blocks: 6 went to disk
        assert (before.memory_blocks, before.disk_blocks, before.blocks_total) == (4, 6, 10)
        assert (before.bytes_used, before.disk_bytes_used) == (4 * BLOCK, 6 * BLOCK)
        assert before.memory_evictions_total == 6 and before.evictions_total == 6
        client.close()

    with start(tmp_path) as node:  # the previous one was SIGTERMed: memory is gone, disk stays
        client = CacheStoreClient(node.address, layout())
        on_disk = [key(name) for name in names[:6]]
        assert client.lookup(on_disk) == 6
        assert client.lookup([key(names[6])]) == 0
        assert client.get(on_disk[::-1]) == [data(name) for name in names[:6]][::-1]
        after = status(client)
        assert (after.hits_total, after.disk_hits_total, after.prefix_hit_blocks_total) == (6, 6, 6)
        assert (after.memory_blocks, after.disk_blocks, after.blocks_total) == (4, 6, 6)  # 4 promoted
        assert after.misses_total == 1
        assert after.disk_bytes_total == 64 * BLOCK
        client.close()


def test_kill_9_during_write_through_puts_loses_only_unfinished_puts(tmp_path):
    finished: list[bytes] = []
    stop = threading.Event()
    release = threading.Event()

    def unfinished_put() -> Iterator[cache_store_pb2.PutChunk]:
        stream = put_stream([(key("whole"), data("whole")), (key("half"), data("half"))], chunk_bytes=BLOCK // 2)
        yield from (next(stream), next(stream), next(stream))  # one whole block, then half of the next
        release.wait(30)

    def put_continuously(address: str) -> None:
        client = CacheStoreClient(address, layout(), timeout_s=5)
        for i in range(10_000):
            if stop.is_set():
                break
            batch = [key(f"p{i}.{j}") for j in range(3)]
            try:
                client.put([(k, data(k.hex()[-8:])) for k in batch])
            except grpc.RpcError:
                break
            finished.extend(batch)
        client.close()

    # one caller (this process) stages the hung put's two blocks and each 3-block put at once: at most the
    # memory tier's capacity (assembly.StagingBudget), so memory holds 8 blocks here
    with start(tmp_path, "--disk-write-through", capacity=8 * BLOCK) as node:
        channel = open_sync_channel(node.address, "cache-store")
        hung = cache_store_pb2_grpc.CacheStoreStub(channel).Put.future(unfinished_put(), timeout=30)
        putter = threading.Thread(target=put_continuously, args=(node.address,))
        putter.start()
        deadline = time.monotonic() + 10
        while len(finished) < 30 and time.monotonic() < deadline:
            time.sleep(0.01)
        node.process.kill()  # SIGKILL, mid-puts
        assert node.process.wait(5) == -9
        stop.set()
        putter.join(10)
        release.set()
        with pytest.raises(grpc.RpcError):
            hung.result()
        channel.close()

    assert len(finished) >= 30
    with start(tmp_path) as node:
        client = CacheStoreClient(node.address, layout())
        assert client.lookup(finished) == len(finished)
        assert client.get(finished[-3:]) == [data(k.hex()[-8:]) for k in finished[-3:]]
        assert client.lookup([key("whole")]) == 0 and client.lookup([key("half")]) == 0
        assert not [path for path in tmp_path.iterdir() if path.name.endswith(".tmp")]
        client.close()


def test_a_damaged_disk_file_is_a_missing_block_over_grpc(tmp_path):
    with start(tmp_path, "--disk-write-through") as node:
        client = CacheStoreClient(node.address, layout())
        chain = [key(name) for name in ("a", "b", "c")]
        client.put([(k, data(k.hex())) for k in chain])
        client.put([(key(f"x{i}"), data(f"x{i}")) for i in range(4)])  # a, b, c: disk only now
        path = tmp_path / chain[1].hex()
        raw = bytearray(path.read_bytes())
        raw[-100] ^= 0xFF
        path.write_bytes(bytes(raw))

        assert client.lookup(chain) == 3  # not read yet: still indexed
        with pytest.raises(grpc.RpcError) as missing:
            client.get(chain)
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND
        assert "keys[1]" in missing.value.details()
        assert not path.exists()
        assert client.get(chain, allow_partial=True) == [data(chain[0].hex())]
        assert client.lookup(chain) == 1
        assert status(client).disk_evictions_total == 1
        client.close()


def test_cut_put_stream_over_grpc_stores_nothing(tmp_path):
    with start(tmp_path, "--disk-write-through") as node, open_sync_channel(node.address, "cache-store") as channel:
        stub = cache_store_pb2_grpc.CacheStoreStub(channel)
        before = stub.NodeStatus(node_pb2.NodeStatusRequest(), timeout=5)
        with pytest.raises(grpc.RpcError) as cut:
            stub.Put(put_stream([(key("a"), data("a")), (key("b"), data("b"))], truncate=key("b")), timeout=5)
        assert cut.value.code() == grpc.StatusCode.DATA_LOSS
        after = stub.NodeStatus(node_pb2.NodeStatusRequest(), timeout=5)
        assert (after.blocks_total, after.disk_blocks, after.bytes_used) == (before.blocks_total, 0, 0)
        assert os.listdir(tmp_path) == []

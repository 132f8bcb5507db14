"""KV staged in host memory for the cache-store is counted and bounded: while the store hangs, copies
stay in host memory (and resume from there), ``host_bytes_held`` reports them, and past the staging limit a
victim is recomputed instead of staging more. Torch tensors, a fake store, no model."""

from __future__ import annotations

import threading

import torch

from kvcache.kv_bytes import bytes_per_block
from services.engine.kv_offload import KVOffload
from services.engine.step_batch import SwapIn, SwapOut
from services.engine_node.remote_store import BreakerRemoteStore


class HungStore:
    """A cache-store whose puts never answer until released."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.deleted: list[list[bytes]] = []

    def put(self, blocks):
        self.release.wait(10)
        raise ConnectionError("the cache-store did not answer")

    def get(self, keys, *, restore):
        raise AssertionError("nothing was stored")

    def delete(self, keys):
        self.deleted.append(list(keys))
        return 0


def test_copies_staged_for_a_hung_store_are_counted_bounded_and_resumed_from_host_memory():
    kv_cache = torch.arange(2 * 8 * 4, dtype=torch.float32).reshape(2, 8, 4)  # 2 layers, 8 blocks of 4
    block = bytes_per_block(kv_cache)
    store = HungStore()
    offload = KVOffload(block, host_budget_bytes=0, remote=BreakerRemoteStore(store), remote_first=True,
                        staging_limit_bytes=5 * block)
    try:
        assert offload.claim("a", 3) and offload.host_bytes_held == 3 * block  # claimed: counted at once
        offload.copy_out(kv_cache, [SwapOut("a", (0, 1, 2))])
        assert offload.claim("b", 2) and offload.host_bytes_held == 5 * block
        offload.copy_out(kv_cache, [SwapOut("b", (3, 4))])
        assert not offload.claim("c", 1)  # past the limit: recomputed, nothing staged
        offload.reclaim()  # the puts hang: nothing stored, nothing dropped
        assert offload.host_bytes_held == 5 * block and offload.host_bytes_used == 0
        assert offload.ready("a")  # its bytes are still here: it resumes from them
        restored = torch.zeros_like(kv_cache)
        offload.copy_in(restored, [SwapIn("a", (5, 6, 7), 0)])
        assert torch.equal(restored[:, 5:8], kv_cache[:, 0:3])
        assert offload.host_bytes_held == 2 * block
        offload.discard("b")
        assert offload.host_bytes_held == 0
    finally:
        store.release.set()
    offload.wait_io()
    # a's put failed (it may have landed): its delete waits for the store to answer again; b's put was
    # refused by the breaker without reaching the store: nothing to delete
    assert store.deleted == [] and offload.remote.breaker.is_open()
    assert offload.stats.offloaded_remote_bytes_total == 0  # nothing reached the store
    assert offload.stats.offloaded_bytes_total == 5 * block
    offload.close()  # a's parked delete is retried on a timer while the breaker is open: stopped here


class MemoryStore:
    def __init__(self) -> None:
        self.blocks: dict[bytes, bytes] = {}

    def put(self, blocks):
        self.blocks.update((key, bytes(data)) for key, data in blocks)

    def get(self, keys, *, restore):
        assert restore  # a preempted copy read back: the store counts it apart from prefix hits
        return [self.blocks[key] for key in keys]

    def delete(self, keys):
        return sum(self.blocks.pop(key, None) is not None for key in keys)


def test_a_stored_copy_no_longer_wanted_is_deleted_from_the_store():
    """An aborted or finished request's copy (discarded without a resume) leaves nothing in the store."""
    kv_cache = torch.arange(2 * 8 * 4, dtype=torch.float32).reshape(2, 8, 4)
    store = MemoryStore()
    offload = KVOffload(bytes_per_block(kv_cache), host_budget_bytes=0, remote=BreakerRemoteStore(store),
                        remote_first=True)
    assert offload.claim("aborted", 2)
    offload.copy_out(kv_cache, [SwapOut("aborted", (1, 2))])
    offload.wait_io()
    assert len(store.blocks) == 2 and offload.remote_keys("aborted") is not None
    assert offload.stats.offloaded_remote_bytes_total == 2 * bytes_per_block(kv_cache)
    offload.discard("aborted")
    offload.wait_io()
    assert store.blocks == {}
    offload.close()


def _offload_threads() -> set[threading.Thread]:
    return {thread for thread in threading.enumerate() if thread.name.startswith("kv-offload")}


def test_close_stops_the_offload_threads_and_a_later_discard_is_harmless():
    """An engine that stops (a node restarted in-process, every test's engine) leaves no offload threads;
    a put that ends after the close does not try to queue its delete on the closed executor."""
    kv_cache = torch.arange(2 * 8 * 4, dtype=torch.float32).reshape(2, 8, 4)
    store = HungStore()
    before = _offload_threads()
    offload = KVOffload(bytes_per_block(kv_cache), host_budget_bytes=0, remote=BreakerRemoteStore(store),
                        remote_first=True)
    assert offload.claim("a", 2)
    offload.copy_out(kv_cache, [SwapOut("a", (1, 2))])
    started = _offload_threads() - before  # its put's thread (other tests' offloads may be collected meanwhile)
    offload.discard("a")  # its delete waits for the hung put
    offload.close()
    store.release.set()  # the put fails now; its done-callback must not raise on the closed executor
    for thread in started:
        thread.join(5)
    assert started and not any(thread.is_alive() for thread in started)
    assert store.deleted == []  # dropped with the executor

"""The cache-store keys of a preempted request's KV copy are unguessable.

The store keeps a key's first writer (first writer wins). Keys another caller could compute (from the
request id and a per-process counter, as they once were) let a prefill identity put garbage under them before
the decode node did: the decode node's put then kept the garbage, and the request resumed from it. Torch
tensors and an in-memory store, no model."""

from __future__ import annotations

import torch

from kvcache.kv_bytes import bytes_per_block
from kvcache.store_keys import store_key
from services.engine.kv_offload import KVOffload
from services.engine.step_batch import SwapOut
from services.engine_node.remote_store import BreakerRemoteStore

FINGERPRINT = bytes(range(16))


class MemoryStore:
    def __init__(self) -> None:
        self.blocks: dict[bytes, bytes] = {}

    def put(self, blocks):
        for key, data in blocks:
            self.blocks.setdefault(key, bytes(data))

    def get(self, keys, *, restore):
        return [self.blocks[key] for key in keys]

    def delete(self, keys):
        return sum(self.blocks.pop(key, None) is not None for key in keys)


def _stored_keys(request_id: str) -> list[bytes]:
    """The keys a fresh engine process's offload uses for ``request_id``'s first preemption."""
    kv_cache = torch.arange(2 * 8 * 4, dtype=torch.float32).reshape(2, 8, 4)
    offload = KVOffload(bytes_per_block(kv_cache), host_budget_bytes=0, remote=BreakerRemoteStore(MemoryStore()),
                        fingerprint=FINGERPRINT, remote_first=True)
    assert offload.claim(request_id, 4)
    offload.copy_out(kv_cache, [SwapOut(request_id, (0, 1, 2, 3))])
    offload.wait_io()
    keys = offload.remote_keys(request_id)
    assert keys is not None
    return keys


def test_the_same_request_in_two_processes_gets_different_keys() -> None:
    first, second = _stored_keys("r0"), _stored_keys("r0")
    assert len(set(first)) == 4 and not set(first) & set(second)


def test_keys_are_the_models_fingerprint_and_128_random_bits() -> None:
    keys = _stored_keys("r0")
    assert all(key == store_key(FINGERPRINT, key[len(FINGERPRINT):]) for key in keys)
    assert all(len(key) == len(FINGERPRINT) + 16 for key in keys)
    assert len({key[len(FINGERPRINT):] for key in keys}) == 4

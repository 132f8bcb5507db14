"""The engine's side of the cache-store is a seam: the node's adapter (``services/engine_node/remote_store.py``)
turns gRPC errors into the engine's ``RemoteStore*`` exceptions behind a breaker of its own, and a node's
``NodeStatus`` is made from the engine's ``stats()`` snapshot alone."""

from __future__ import annotations

import grpc
import pytest

from services.cache_store.breaker import StoreBreaker
from services.engine.remote_store import RemoteStoreError, RemoteStoreFault, RemoteStoreUnavailable
from services.engine_node.kv_layout import kv_layout, layout_id
from services.engine_node.remote_store import BreakerRemoteStore
from services.engine_node.status import node_status
from tests.conftest import make_engine


class Status(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return "boom"


class ScriptedClient:
    """Fails each call with the next scripted error (None: answers)."""

    def __init__(self, *errors: BaseException | None) -> None:
        self.errors = list(errors)
        self.calls = 0

    def _next(self) -> None:
        self.calls += 1
        error = self.errors.pop(0) if self.errors else None
        if error is not None:
            raise error

    def put(self, blocks):
        self._next()

    def get(self, keys, *, restore):
        self._next()
        return [b"x" for _ in keys]

    def delete(self, keys):
        self._next()
        return len(keys)


def test_refusals_leave_the_store_available_and_faults_make_calls_fail_fast():
    now = [0.0]
    client = ScriptedClient(Status(grpc.StatusCode.NOT_FOUND), Status(grpc.StatusCode.RESOURCE_EXHAUSTED),
                            Status(grpc.StatusCode.DEADLINE_EXCEEDED))
    store = BreakerRemoteStore(client, StoreBreaker(cooldown_s=5.0, clock=lambda: now[0]))
    with pytest.raises(RemoteStoreError, match="NOT_FOUND: boom") as refused:
        store.get([b"k"], restore=True)
    assert not isinstance(refused.value, RemoteStoreFault)
    with pytest.raises(RemoteStoreError, match="RESOURCE_EXHAUSTED") as refused:
        store.put([(b"k", b"v")])
    assert not isinstance(refused.value, RemoteStoreFault)
    assert store.available() and store.trips_total == 0

    with pytest.raises(RemoteStoreFault, match="DEADLINE_EXCEEDED") as fault:
        store.delete([b"k"])
    assert not isinstance(fault.value, RemoteStoreUnavailable)
    assert not store.available() and store.trips_total == 1
    with pytest.raises(RemoteStoreUnavailable):
        store.put([(b"k", b"v")])
    assert client.calls == 3  # not tried

    now[0] += 5.0  # the cooldown ends: one test call decides
    assert store.available() and store.get([b"k"], restore=True) == [b"x"]
    with pytest.raises(RemoteStoreFault):
        BreakerRemoteStore(ScriptedClient(ConnectionRefusedError("refused"))).delete([b"k"])


def test_node_status_is_made_from_the_engines_stats_snapshot(fp32_model, bundled_tokenizer):
    engine = make_engine(fp32_model, bundled_tokenizer, num_kv_blocks=64)
    engine.generate([[1, 2, 3, 4, 5]] * 2)
    stats = engine.stats()
    status = node_status(stats, "decode", "127.0.0.1:1", healthy=False)
    assert (status.role, status.address, status.healthy) == ("decode", "127.0.0.1:1", False)
    assert status.blocks_total == 64 and status.block_size == engine.block_size == stats.kv_layout.block_size
    assert status.requests_total == 2 and status.prompt_tokens_total == 10
    assert status.blocks_free + status.blocks_cached == 64
    assert status.kv_layout_id == layout_id(kv_layout(engine.kv_layout_spec())) != ""
    assert status.store_breaker_trips_total == 0 and status.model_name == str(engine.model_identity["model"])

"""The engine's :class:`~services.engine.remote_store.RemoteBlockStore`, node side: a cache-store client
behind a :class:`~services.cache_store.breaker.StoreBreaker`.

:func:`connect_remote_store` is the factory a node passes to the engine (``LLMEngine.from_config(config,
remote_store=connect_remote_store)``): each call makes a fresh client and breaker, so the KV offload and the
output cache each fail fast on their own. Every call goes through the breaker; its errors reach the engine
as the engine's own exceptions, never as gRPC's: :class:`StoreUnavailable` (not tried) as
:class:`RemoteStoreUnavailable`, a store fault (``is_store_fault``: timed out, unreachable) as
:class:`RemoteStoreFault`, any other gRPC error (the store answered: ``NOT_FOUND``, ``RESOURCE_EXHAUSTED``)
as :class:`RemoteStoreError`, which leaves the breaker closed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

import grpc

from services.cache_store.breaker import StoreBreaker, StoreUnavailable, describe, is_store_fault
from services.cache_store.client import CacheStoreClient
from services.engine.kv_layout_spec import KVLayoutSpec
from services.engine.remote_store import RemoteStoreError, RemoteStoreFault, RemoteStoreUnavailable
from services.engine_node.kv_layout import kv_layout

T = TypeVar("T")


class BlockClient(Protocol):
    """What the adapter calls (:class:`CacheStoreClient`, or a fake in tests)."""

    def put(self, blocks: Sequence[tuple[bytes, bytes | memoryview]]) -> object: ...
    def get(self, keys: Sequence[bytes], *, restore: bool) -> list[bytes]: ...
    def delete(self, keys: Sequence[bytes]) -> int: ...


class BreakerRemoteStore:
    """A :class:`~services.engine.remote_store.RemoteBlockStore` over ``client``, through ``breaker``."""

    def __init__(self, client: BlockClient, breaker: StoreBreaker | None = None):
        self.client = client
        self.breaker = breaker or StoreBreaker()

    def available(self) -> bool:
        return not self.breaker.is_open()

    @property
    def trips_total(self) -> int:
        return self.breaker.trips_total

    def put(self, blocks: Sequence[tuple[bytes, bytes | memoryview]]) -> None:
        self._call(self.client.put, blocks)

    def get(self, keys: Sequence[bytes], *, restore: bool) -> list[bytes]:
        return self._call(self.client.get, keys, restore=restore)

    def delete(self, keys: Sequence[bytes]) -> int:
        return self._call(self.client.delete, keys)

    def close(self) -> None:
        close = getattr(self.client, "close", None)  # a fake client may hold nothing to close
        if close is not None:
            close()

    def _call(self, fn: Callable[..., T], *args, **kwargs) -> T:
        try:
            return self.breaker.call(fn, *args, **kwargs)
        except StoreUnavailable as error:
            raise RemoteStoreUnavailable(str(error)) from error
        except (grpc.RpcError, ConnectionError, TimeoutError) as error:
            if is_store_fault(error):
                raise RemoteStoreFault(describe(error)) from error
            raise RemoteStoreError(describe(error)) from error


def connect_remote_store(address: str, layout: KVLayoutSpec) -> BreakerRemoteStore:
    """A fresh client of the cache-store at ``address`` for blocks of ``layout``, with a breaker of its own
    (the engine's ``remote_store`` factory)."""
    return BreakerRemoteStore(CacheStoreClient(address, kv_layout(layout)))

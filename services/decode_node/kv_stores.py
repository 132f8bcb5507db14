"""The decode node as a client of cache-stores: the KV of a request it adopts is read from the store the
handing node names (``Adopt.cache_store``). One client per store address, opened on first use.

A failed read becomes ``UnavailableError`` naming the store, so node logic sees no gRPC errors. A store that
could not be reached (``UNAVAILABLE``, ``DEADLINE_EXCEEDED``) is reported in one text whatever the cause,
and its client is closed: an ``Adopt`` naming arbitrary addresses learns nothing of which ports are open
(a refused connection read differently from a silent port), and leaves no client behind. The cause is
logged.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc
import grpc.aio
import structlog

from services.cache_store.client import AsyncCacheStoreClient
from services.common.errors import UnavailableError
from services.engine.kv_layout_spec import KVLayoutSpec
from services.engine_node.kv_layout import kv_layout

log = structlog.get_logger(__name__)


class KVStores:
    def __init__(self, layout: KVLayoutSpec):
        """``layout``: this node's KV layout (``services.engine_node.kv_layout``), which the stores check."""
        self.layout = layout
        self.clients: dict[str, AsyncCacheStoreClient] = {}  # by store address

    async def fetch(self, address: str, keys: Sequence[bytes]) -> bytes:
        """The blocks under ``keys`` (restored to the store's memory tier), joined in order. Raises
        ``UnavailableError`` when the store cannot serve them."""
        if not keys:
            return b""
        try:
            blocks = await self._client(address).get(keys, restore=True)
        except grpc.aio.AioRpcError as error:
            if error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                log.warning("cache-store unreachable", address=address, code=error.code().name,
                            details=error.details())
                client = self.clients.pop(address, None)
                if client is not None:
                    await client.close()
                raise UnavailableError(f"cache-store {address}: unreachable") from error
            raise UnavailableError(f"cache-store {address}: {error.code().name}: {error.details()}") from error
        return b"".join(blocks)

    def _client(self, address: str) -> AsyncCacheStoreClient:
        client = self.clients.get(address)
        if client is None:
            client = self.clients[address] = AsyncCacheStoreClient(address, kv_layout(self.layout))
        return client

    async def close(self) -> None:
        for client in self.clients.values():
            await client.close()
        self.clients.clear()

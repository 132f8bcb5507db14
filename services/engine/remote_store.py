"""What the engine needs of a remote block store (the cache-store), declared here and injected by the node.

The engine's KV offload (``kv_offload.py``: preempted requests' KV) and output cache (``output_cache.py``:
finished requests' blocks) each get a :class:`RemoteBlockStore` of their own from the factory the node
passes to :class:`~services.engine.engine.LLMEngine` (``remote_store=``: ``factory(address, layout)``).
The node's adapter (``services.engine_node.remote_store``) puts every call through a circuit breaker of its
own and turns transport errors into the exceptions below, so the engine sees neither gRPC nor the breaker:

- :class:`RemoteStoreUnavailable`: the call was not tried, the store failed moments ago (the breaker is
  open; :meth:`RemoteBlockStore.available` says so before a call is even started);
- :class:`RemoteStoreFault`: the store did not answer in time or could not be reached (the call may or may
  not have landed); it opens the breaker;
- :class:`RemoteStoreError`: the store answered with a refusal (a key not found, no room for a put): it
  works, and the breaker stays closed.

Blocking calls: the engine makes them on threads of its own, never on the step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from services.engine.kv_layout_spec import KVLayoutSpec


class RemoteStoreError(Exception):
    """The store refused a call (it answered: the store works). The message says why."""


class RemoteStoreFault(RemoteStoreError):
    """The store did not answer or could not be reached: calls fail fast for a while after one."""


class RemoteStoreUnavailable(RemoteStoreFault):
    """A call not tried: the store failed moments ago (it never reached the store)."""


class RemoteBlockStore(Protocol):
    """A store of ``(key, bytes)`` blocks under ``kvcache.store_keys`` keys, for one user in the engine."""

    def available(self) -> bool:
        """False while calls fail fast (the store failed moments ago): a caller need not start one."""
        ...

    @property
    def trips_total(self) -> int:
        """Times a store fault made calls fail fast (reported as the node's breaker trips)."""
        ...

    def put(self, blocks: Sequence[tuple[bytes, bytes | memoryview]]) -> None:
        """Store the blocks atomically."""
        ...

    def get(self, keys: Sequence[bytes], *, restore: bool) -> list[bytes]:
        """The blocks' bytes in order (:class:`RemoteStoreError` if one is missing). ``restore``: a
        request's own KV read back, not a prefix hit (the store counts it apart)."""
        ...

    def delete(self, keys: Sequence[bytes]) -> int:
        """Remove the keys; how many the store held."""
        ...

    def close(self) -> None:
        """Release the connection (the engine is going away)."""
        ...


RemoteStoreFactory = Callable[[str, KVLayoutSpec], RemoteBlockStore]
"""``factory(address, layout)``: a fresh store for one user (its own breaker) of the store at ``address``
(``EngineConfig.offload_cache_store``), for blocks of ``layout``."""

"""Where a preempted request's KV waits: host memory up to a byte budget, then the cache-store (or the
cache-store first, with ``remote_first``: the ``--offload-remote always`` setting).

The scheduler decides (through the torch-free :class:`~services.engine.step_batch.KVOffloader` methods
``claim`` / ``ready`` / ``prefetch`` / ``discard``); the engine moves the bytes while a step runs
(:meth:`copy_out` before the victim's blocks are freed, :meth:`copy_in` into the resumed request's new
blocks). A copy bound for the cache-store is staged in host memory and put there by a background thread;
once stored, the host bytes are dropped after the step (:meth:`reclaim`), and a resume first fetches them
back in the background (:meth:`prefetch`) — the scheduler resumes the request when :meth:`ready` says so.
A copy that cannot be stored or fetched is forgotten: the request is then recomputed (counted). Bytes
staged for the cache-store (not yet stored, or stored and fetched back) are host memory too: they count in
:attr:`host_bytes_held`, and at most ``staging_limit_bytes`` of them may be held at once (the engine gives
its KV pool's size) — past it a victim is recomputed, so a hung cache-store cannot fill host memory. A copy
the cache-store holds (:meth:`remote_keys`) is what lets another decode node adopt the request
(``handover.py``); its keys are request-scoped (a random block id under the model fingerprint), so
once the copy is read back or no longer wanted (:meth:`discard`: resumed, finished, aborted, handed over)
its keys are deleted from the cache-store in the background (once its put ended, on a thread of their
own), where they would only crowd out prefix blocks.
The cache-store is a :class:`~services.engine.remote_store.RemoteBlockStore` the node injects, its calls
behind a circuit breaker: once one fails for the store's sake (:class:`RemoteStoreFault`), the calls
queued behind it fail fast (:class:`RemoteStoreUnavailable`; their requests resume from host memory or
are recomputed) and, while the store is not :meth:`~RemoteBlockStore.available`, new victims' copies stay
in host memory while the budget has room (even with ``remote_first``) and are recomputed past it. A delete
is not lost to the breaker: it waits (on its own thread, holding nobody up) and goes once the store
answers again; a copy whose put never reached the store has nothing to delete.

Threads: ``claim``/``ready``/``prefetch``/``discard`` run under the engine lock; ``copy_out``/``copy_in``
run on the engine thread during a step, for requests whose aborts the engine defers until it ends.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import structlog
import torch

from kvcache.kv_bytes import read_blocks, write_blocks
from kvcache.store_keys import FINGERPRINT_BYTES, store_key
from services.engine.remote_store import RemoteBlockStore, RemoteStoreError, RemoteStoreFault, RemoteStoreUnavailable
from services.engine.step_batch import SwapIn, SwapOut

log = structlog.get_logger(__name__)
MAX_PARKED_DELETES = 4096  # deletes kept while the cache-store is failing; older ones are left to its LRU
PARKED_RETRY_S = 1.0  # how often parked deletes are tried again while nothing else sends them


@dataclass
class _Copy:
    num_blocks: int
    remote: bool
    keys: list[bytes] = field(default_factory=list)
    data: bytes | None = None  # the bytes, while in host memory
    stored: Future | None = None  # remote: the put
    fetched: Future | None = None  # remote: the get that brings it back


@dataclass
class OffloadStats:
    offloaded_bytes_total: int = 0
    offloaded_remote_bytes_total: int = 0
    restored_bytes_total: int = 0
    fetched_remote_bytes_total: int = 0  # brought back from the cache-store for a resume
    lost_total: int = 0  # copies that could not be stored or fetched (their requests recompute)


class KVOffload:
    def __init__(self, bytes_per_block: int, host_budget_bytes: int, remote: RemoteBlockStore | None = None,
                 fingerprint: bytes = bytes(FINGERPRINT_BYTES), remote_first: bool = False,
                 staging_limit_bytes: int | None = None):
        self.bytes_per_block = bytes_per_block
        self.host_budget_bytes = host_budget_bytes
        self.staging_limit_bytes = staging_limit_bytes  # None: no limit
        self.remote = remote
        self.remote_first = remote_first and remote is not None  # every copy goes to the cache-store
        self.fingerprint = fingerprint  # the prefix of every cache-store key
        self.host_bytes_used = 0  # claimed by host copies
        self.stats = OffloadStats()
        self._copies: dict[str, _Copy] = {}
        self._io = ThreadPoolExecutor(1, thread_name_prefix="kv-offload") if remote is not None else None
        # deletes wait for their put, but not behind (or in front of) other requests' puts and fetches
        self._deletes = ThreadPoolExecutor(1, thread_name_prefix="kv-offload-delete") if remote is not None \
            else None
        self._parked: list[tuple[str, list[bytes]]] = []  # deletes waiting for the store (delete thread only)
        self._retry_lock = threading.Lock()  # guards _retry and _closed (delete, timer and engine threads)
        self._retry: threading.Timer | None = None  # armed: sends the parked deletes again
        self._closed = False

    # ---- the scheduler's side (torch-free) ----------------------------------------------------------
    def claim(self, request_id: str, num_blocks: int) -> bool:
        size = num_blocks * self.bytes_per_block
        store_down = self.remote is not None and not self.remote.available()
        if (not self.remote_first or store_down) and self.host_budget_bytes > 0 \
                and self.host_bytes_used + size <= self.host_budget_bytes:  # (0: off, even for blocks of no bytes)
            self.host_bytes_used += size
            self._copies[request_id] = _Copy(num_blocks, remote=False)
            return True
        if self.remote is not None and not store_down:
            staged = self.staged_bytes() if self.staging_limit_bytes is not None else None
            if staged is not None and staged + size > self.staging_limit_bytes:
                log.info("no room to stage preempted KV for the cache-store; the request will be recomputed",
                         request_id=request_id, staged_bytes=staged)
                return False
            # unguessable: the store keeps a key's first writer, so a key another caller could compute first
            # would let it plant the bytes this request resumes from
            keys = [store_key(self.fingerprint, secrets.token_bytes(16)) for _ in range(num_blocks)]
            self._copies[request_id] = _Copy(num_blocks, remote=True, keys=keys)
            return True
        return False

    def staged_bytes(self) -> int:
        """Host bytes of copies bound for (or fetched back from) the cache-store, claimed ones included."""
        staged = 0
        for copy in list(self._copies.values()):
            if copy.remote:
                data = copy.data
                if data is not None:
                    staged += len(data)
                elif copy.stored is None:  # claimed, copied out during the step
                    staged += copy.num_blocks * self.bytes_per_block
        return staged

    @property
    def host_bytes_held(self) -> int:
        """All host memory holding preempted KV now: host copies and staged ones."""
        return self.host_bytes_used + self.staged_bytes()

    def ready(self, request_id: str) -> bool | None:
        copy = self._copies.get(request_id)
        if copy is None:
            return None
        if copy.data is not None:
            return True
        failed = next((f for f in (copy.stored, copy.fetched) if f is not None and f.done() and f.exception()), None)
        if failed is not None:
            log.warning("offloaded KV lost; the request will be recomputed", request_id=request_id,
                        error=repr(failed.exception()))
            self.stats.lost_total += 1
            self.discard(request_id)
            return None
        if copy.fetched is not None and copy.fetched.done():
            copy.data = b"".join(copy.fetched.result())
            self.stats.fetched_remote_bytes_total += len(copy.data)
            return True
        return False

    def prefetch(self, request_id: str) -> None:
        copy = self._copies.get(request_id)
        if copy is None or not copy.remote or copy.fetched is not None or copy.data is not None:
            return
        if copy.stored is not None and copy.stored.done():
            copy.fetched = self._io.submit(self.remote.get, copy.keys, restore=True)

    def remote_keys(self, request_id: str) -> list[bytes] | None:
        """The cache-store keys of the request's copy once stored there (None: no such copy, or not yet)."""
        copy = self._copies.get(request_id)
        if copy is None or not copy.remote or copy.stored is None or not copy.stored.done() \
                or copy.stored.exception() is not None:
            return None
        return list(copy.keys)

    def discard(self, request_id: str) -> None:
        copy = self._copies.pop(request_id, None)
        if copy is None:
            return
        if not copy.remote:
            self.host_bytes_used -= copy.num_blocks * self.bytes_per_block
        elif copy.stored is not None:
            keys = copy.keys
            copy.stored.add_done_callback(lambda put: self._submit_delete(request_id, keys, put))

    def _submit_delete(self, request_id: str, keys: list[bytes], put: Future) -> None:
        if put.cancelled() or isinstance(put.exception(), RemoteStoreUnavailable):
            return  # the put never reached the store: nothing to delete
        with contextlib.suppress(RuntimeError):  # closed: the engine is going away
            self._deletes.submit(self._delete_remote, request_id, keys)

    def wait_io(self) -> None:
        """Wait for the cache-store puts, gets and deletes submitted so far."""
        if self._io is not None:
            self._io.submit(lambda: None).result()
            self._deletes.submit(lambda: None).result()

    def close(self) -> None:
        """Stop the background threads (queued puts, fetches and deletes are dropped: the engine is going
        away, and the cache-store's LRU ages out what it was not told to delete)."""
        with self._retry_lock:  # first: a timer firing now submits nothing to the closed executor
            self._closed = True
            if self._retry is not None:
                self._retry.cancel()
        for executor in (self._io, self._deletes):
            if executor is not None:
                executor.shutdown(wait=False, cancel_futures=True)

    def _delete_remote(self, request_id: str, keys: list[bytes]) -> None:
        """On the delete thread. While the breaker is open, or when a delete fails for the store's sake,
        the delete waits in a list (at most ``MAX_PARKED_DELETES``; a copy not deleted would crowd out
        prefix blocks until the store's LRU ages it out) and goes once the store answers again: with the
        next delete, or by a retry every ``PARKED_RETRY_S`` (an idle node sends none)."""
        self._parked.append((request_id, keys))
        del self._parked[:-MAX_PARKED_DELETES]
        self._send_parked()

    def _send_parked(self) -> None:
        """On the delete thread: send the parked deletes in order, until the store fails again."""
        while self._parked:
            if not self.remote.available():
                self._retry_parked_later()
                return
            rid, parked_keys = self._parked[0]
            try:
                self.remote.delete(parked_keys)
            except RemoteStoreFault:  # not tried (it failed again meanwhile), timed out or unreachable:
                self._retry_parked_later()  # deleting again later is harmless
                return
            except RemoteStoreError as error:
                log.info("could not delete a preempted request's copy from the cache-store", request_id=rid,
                         error=str(error))  # the store refused it: its LRU ages the copy out
            del self._parked[0]

    def _retry_parked_later(self) -> None:
        """Arm a timer that puts :meth:`_send_parked` back on the delete thread in ``PARKED_RETRY_S``
        (one armed at a time; none once closed)."""
        with self._retry_lock:
            if self._retry is not None or self._closed:
                return
            self._retry = threading.Timer(PARKED_RETRY_S, self._submit_send_parked)
            self._retry.daemon = True
            self._retry.start()

    def _submit_send_parked(self) -> None:
        """On the timer's thread: disarmed before the send is queued, so a send that finds the store still
        failing arms the next one."""
        with self._retry_lock:
            self._retry = None
            if not self._closed:
                self._deletes.submit(self._send_parked)

    # ---- the engine's side: moving bytes during a step ----------------------------------------------
    def copy_out(self, kv_cache: torch.Tensor, swaps: Sequence[SwapOut]) -> None:
        for swap in swaps:
            copy = self._copies[swap.request_id]
            data = read_blocks(kv_cache, swap.block_ids)
            copy.data = data
            self.stats.offloaded_bytes_total += len(data)
            if copy.remote:
                copy.stored = self._io.submit(self._put_remote, copy, data)

    def _put_remote(self, copy: _Copy, data: bytes) -> None:
        """On the I/O thread. Counted once stored: a failed put's bytes stayed in host memory."""
        view, size = memoryview(data), self.bytes_per_block
        self.remote.put([(key, view[i * size:(i + 1) * size]) for i, key in enumerate(copy.keys)])
        self.stats.offloaded_remote_bytes_total += len(data)  # only this thread writes it

    def reclaim(self) -> None:
        """After a step (engine lock held): drop the host bytes of copies the cache-store now holds."""
        for copy in self._copies.values():
            if copy.remote and copy.fetched is None and copy.stored is not None and copy.stored.done() \
                    and copy.stored.exception() is None:
                copy.data = None

    def copy_in(self, kv_cache: torch.Tensor, swaps: Sequence[SwapIn]) -> None:
        for swap in swaps:
            copy = self._copies[swap.request_id]
            data = copy.data
            assert data is not None, f"{swap.request_id}: resumed before its KV was ready"
            size = self.bytes_per_block
            write_blocks(kv_cache, swap.block_ids,
                         memoryview(data)[swap.first_index * size:(swap.first_index + len(swap.block_ids)) * size])
            self.stats.restored_bytes_total += len(swap.block_ids) * size
            self.discard(swap.request_id)

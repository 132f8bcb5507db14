"""One request's KV stream to a decode node: header, block batches, commit; acks read concurrently.

Blocks go as bytes, or, when the request has an :class:`IpcRoute` (prefill and decode node share a host
and GPU, ``kv_ipc.py``), as their ids in this node's pool, which the decode node copies device to device.
An IPC batch the decode node could not copy comes back with ``ipc_error``: the route is reported failed
(the link falls back to bytes), that batch is sent again as bytes, and so is everything after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc
import grpc.aio
from pdserve.v1 import decode_pb2, decode_pb2_grpc, node_pb2

from services.common.errors import UnavailableError
from services.common.kv_transfer_stats import KVTransferStats

_CODE_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}
IPC_BATCH_BLOCKS = 256
_ID_BYTES = 8  # the most a block id costs in a batch message (a varint): batches of blocks with no bytes stay bounded
"""Blocks per IPC batch: each batch is one message, one device copy and one acknowledgement."""


@dataclass(frozen=True)
class IpcRoute:
    """A request's blocks by CUDA IPC: the accepted session, how to read blocks of this node's pool as
    bytes (for a batch that falls back), and whom to tell when the decode node could not copy one."""

    session_id: str
    read_blocks: Callable[[list[int]], bytes]
    on_failure: Callable[[str], None]


class KVSender:
    """Sends to ``TransferKV``. Every message is acknowledged in order; an error ack or a broken stream
    raises :class:`UnavailableError` (naming the decode node) from the next call. With ``ipc``, blocks
    handed over by reference (:meth:`send_block_refs`) must stay untouched in this node's pool until
    :meth:`commit` returned: it waits for every batch's acknowledgement before it sends the commit."""

    def __init__(self, stub: decode_pb2_grpc.DecodeNodeStub, request_id: str, layout: node_pb2.KVLayout,
                 destination_ids: list[int], address: str, stats: KVTransferStats | None = None,
                 ipc: IpcRoute | None = None, grant_token: bytes = b"",
                 on_committed: Callable[[], None] | None = None):
        """``stats``: the node's counters, advanced as each batch goes out. ``grant_token``: the decode
        node's grant (presented by the header, keepalives and the commit; block batches ride on the
        header's). ``on_committed``: told once the commit is acknowledged."""
        self.stub = stub
        self.request_id = request_id
        self.layout = layout
        self.destination_ids = destination_ids
        self.address = address
        self.grant_token = grant_token
        self.on_committed = on_committed
        self.bytes_sent = 0
        self.blocks_sent = 0
        self.stats = stats if stats is not None else KVTransferStats()
        self._seq = 0
        self._call: grpc.aio.StreamStreamCall | None = None
        self._pending: dict[int, asyncio.Future[decode_pb2.KVAck]] = {}
        self._reader: asyncio.Task[None] | None = None
        self._failure: str | None = None
        self.ipc = ipc
        self.ipc_failed = False
        self.blocks_by_ipc = 0
        self._ipc_batches: dict[int, tuple[list[int], list[int]]] = {}  # seq → (source ids, destination ids)
        self._resends: set[asyncio.Task[None]] = set()
        self._write_lock = asyncio.Lock()
        self._max_payload = 4 << 20  # of the bytes that replace a failed IPC batch
        self._last_write = 0.0  # loop time of the last message written
        self._keepalive: asyncio.Task[None] | None = None
        self._keepalive_stop = asyncio.Event()

    async def open(self, metadata: tuple[tuple[str, str], ...] | None = None) -> None:
        """Start the stream (``metadata``: the trace context of the ``kv_transfer`` span) with its header."""
        self._call = self.stub.TransferKV(metadata=metadata)
        self._reader = asyncio.create_task(self._read_acks())
        await self._send(decode_pb2.KVTransferMessage(header=decode_pb2.KVHeader(
            request_id=self.request_id, layout=self.layout, ipc_session=self.ipc.session_id if self.ipc else "",
            grant_token=self.grant_token)))

    def keep_alive(self, lease_s: float) -> None:
        """Until :meth:`commit` or :meth:`close`: a ``KVKeepAlive`` whenever nothing of the request went out
        for a third of the lease granted (at least 50 ms), so a request queued or fetching here keeps it."""
        interval_s = max(0.05, lease_s / 3)
        self._keepalive = asyncio.create_task(self._keep_alive(interval_s), name=f"kv-keepalive:{self.request_id}")

    async def _keep_alive(self, interval_s: float) -> None:
        loop = asyncio.get_running_loop()
        with contextlib.suppress(UnavailableError):  # the stream failed: the request's next call raises it
            while not self._keepalive_stop.is_set():
                due = self._last_write + interval_s - loop.time()
                if due > 0:
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self._keepalive_stop.wait(), due)
                    continue
                ack = await self._send(decode_pb2.KVTransferMessage(
                    keepalive=decode_pb2.KVKeepAlive(request_id=self.request_id, grant_token=self.grant_token)))
                ack.add_done_callback(lambda f: f.cancelled() or f.exception())  # failures surface elsewhere

    async def _stop_keepalive(self) -> None:
        """Stop the keepalives; a write in progress completes (a cancelled write could tear the stream)."""
        self._keepalive_stop.set()
        if self._keepalive is not None:
            await asyncio.wait([self._keepalive])

    async def send_blocks(self, first_index: int, count: int, payload: bytes, max_payload: int) -> None:
        """Blocks ``first_index ..`` of the prompt (their bytes back to back) to their granted ids."""
        per_block = len(payload) // count
        per_message = max(1, max_payload // max(per_block, _ID_BYTES))  # (a model without KV: ids alone)
        view = memoryview(payload)
        for start in range(0, count, per_message):
            n = min(per_message, count - start)
            ids = self.destination_ids[first_index + start: first_index + start + n]
            chunk = view[start * per_block:(start + n) * per_block]
            started = time.perf_counter()
            await self._send(decode_pb2.KVTransferMessage(blocks=decode_pb2.KVBlockBatch(
                request_id=self.request_id, block_ids=ids, payload=bytes(chunk))))
            self.bytes_sent += len(chunk)
            self.blocks_sent += n
            self.stats.add(len(chunk), n, time.perf_counter() - started)

    async def send_block_refs(self, first_index: int, source_ids: list[int], max_payload: int) -> None:
        """Blocks ``first_index ..`` of the prompt, which are ``source_ids`` of this node's pool, to their
        granted ids: by reference while the IPC route works, else as bytes."""
        assert self.ipc is not None, "send_block_refs needs an IPC route"
        self._max_payload = max_payload
        if self.ipc_failed:
            await self.send_blocks(first_index, len(source_ids), self.ipc.read_blocks(source_ids), max_payload)
            return
        for start in range(0, len(source_ids), IPC_BATCH_BLOCKS):
            sources = source_ids[start:start + IPC_BATCH_BLOCKS]
            ids = self.destination_ids[first_index + start: first_index + start + len(sources)]
            started = time.perf_counter()
            message = decode_pb2.KVTransferMessage(blocks=decode_pb2.KVBlockBatch(
                request_id=self.request_id, block_ids=ids, source_block_ids=sources))
            await self._send(message, lambda seq, s=sources, d=ids: self._ipc_batches.__setitem__(seq, (s, d)))
            size = len(sources) * self.layout.bytes_per_block
            self.bytes_sent += size
            self.blocks_sent += len(sources)
            self.blocks_by_ipc += len(sources)
            self.stats.add(size, len(sources), time.perf_counter() - started)

    async def commit(self, first_token_id: int, num_computed_tokens: int, recurrent_state: bytes | None = None,
                     max_payload: int = 4 << 20) -> None:
        """Send the commit and wait until every message, the commit last, is acknowledged. With an IPC
        route, every block batch is acknowledged (sent again as bytes where IPC failed) before the commit
        goes out. A hybrid model's ``recurrent_state`` goes first, in pieces of ``max_payload`` bytes."""
        started = time.perf_counter()
        await self._stop_keepalive()
        while self.ipc is not None and (self._pending or self._resends):
            await asyncio.gather(*self._pending.values(), *self._resends)
        self._raise_if_failed()
        state = memoryview(recurrent_state or b"")
        for offset in range(0, len(state), max_payload):
            piece = state[offset:offset + max_payload]
            await self._send(decode_pb2.KVTransferMessage(state=decode_pb2.KVState(
                request_id=self.request_id, offset=offset, payload=bytes(piece), total_bytes=len(state))))
            self.bytes_sent += len(piece)
        future = await self._send(decode_pb2.KVTransferMessage(commit=decode_pb2.KVCommit(
            request_id=self.request_id, first_token_id=first_token_id, num_computed_tokens=num_computed_tokens,
            grant_token=self.grant_token)))
        await asyncio.gather(*self._pending.values(), future)
        self.stats.add(0, 0, time.perf_counter() - started)
        self._raise_if_failed()
        if self.on_committed is not None:
            self.on_committed()

    async def close(self) -> None:
        await self._stop_keepalive()
        if self._call is not None:
            with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
                await self._call.done_writing()
            self._call.cancel()
        for task in self._resends:
            task.cancel()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader

    async def _send(self, message: decode_pb2.KVTransferMessage,
                    on_seq: Callable[[int], None] | None = None) -> asyncio.Future[decode_pb2.KVAck]:
        """Number and write one message (writes are serialised: an IPC fallback resends from the ack
        reader); ``on_seq`` learns its seq before it is written."""
        async with self._write_lock:
            self._raise_if_failed()
            self._seq += 1
            message.seq = self._seq
            future: asyncio.Future[decode_pb2.KVAck] = asyncio.get_running_loop().create_future()
            self._pending[self._seq] = future
            if on_seq is not None:
                on_seq(self._seq)
            try:
                await self._call.write(message)
                self._last_write = asyncio.get_running_loop().time()
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as exc:
                self._fail(f"stream broke: {exc}")
                self._raise_if_failed()
        return future

    async def _read_acks(self) -> None:
        try:
            async for ack in self._call:
                future = self._pending.pop(ack.seq, None)
                batch = self._ipc_batches.pop(ack.seq, None)
                if ack.error:
                    if self.ipc is not None and ack.error.startswith("ipc_session"):
                        self.ipc.on_failure(ack.error)  # the decode node lost the session (restarted): bytes next
                    self._fail(f"{_CODE_NAMES.get(ack.code, 'ERROR')}: {ack.error}")
                    return
                if ack.ipc_error and batch is not None:
                    self._ipc_fell_back(ack.ipc_error, batch)
                    continue
                if future is not None and not future.done():
                    future.set_result(ack)
            self._fail("stream ended early")
        except grpc.aio.AioRpcError as exc:
            self._fail(f"{exc.code().name}: {exc.details()}")

    def _ipc_fell_back(self, reason: str, batch: tuple[list[int], list[int]]) -> None:
        """The decode node could not copy an IPC batch (and took none of it): report it once and send the
        batch again as bytes; ``commit`` waits for the resent batch instead."""
        assert self.ipc is not None
        if not self.ipc_failed:
            self.ipc_failed = True
            self.ipc.on_failure(reason)
        task = asyncio.create_task(self._resend(*batch))
        self._resends.add(task)
        task.add_done_callback(self._resends.discard)

    async def _resend(self, sources: list[int], ids: list[int]) -> None:
        """``sources`` as bytes to ``ids``, in messages of at most the byte stream's payload size."""
        assert self.ipc is not None
        per_message = max(1, self._max_payload // max(self.layout.bytes_per_block, _ID_BYTES))
        with contextlib.suppress(UnavailableError):  # the stream failed: commit() raises it
            for start in range(0, len(sources), per_message):
                chunk = slice(start, start + per_message)
                payload = self.ipc.read_blocks(sources[chunk])
                await self._send(decode_pb2.KVTransferMessage(blocks=decode_pb2.KVBlockBatch(
                    request_id=self.request_id, block_ids=ids[chunk], payload=payload)))
                self.blocks_by_ipc -= len(sources[chunk])

    def _fail(self, reason: str) -> None:
        if self._failure is None:
            self._failure = reason
        for future in self._pending.values():
            if not future.done():
                future.set_exception(UnavailableError(f"decode node {self.address}: {reason}"))
                future.exception()  # retrieved: a batch's ack nobody awaits would be logged as never retrieved
        self._pending.clear()

    def _raise_if_failed(self) -> None:
        if self._failure is not None:
            raise UnavailableError(f"decode node {self.address}: {self._failure}")

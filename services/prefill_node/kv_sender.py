"""One request's KV stream to a decode node: header, block batches, commit; acks read concurrently."""

from __future__ import annotations

import asyncio
import contextlib
import time

import grpc
import grpc.aio
from pdserve.v1 import decode_pb2, decode_pb2_grpc, node_pb2

from services.common.errors import UnavailableError
from services.common.kv_transfer_stats import KVTransferStats

_CODE_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}


class KVSender:
    """Sends to ``TransferKV``. Every message is acknowledged in order; an error ack or a broken stream
    raises :class:`UnavailableError` (naming the decode node) from the next call."""

    def __init__(self, stub: decode_pb2_grpc.DecodeNodeStub, request_id: str, layout: node_pb2.KVLayout,
                 destination_ids: list[int], address: str, stats: KVTransferStats | None = None):
        """``stats``: the node's counters, advanced as each batch goes out."""
        self.stub = stub
        self.request_id = request_id
        self.layout = layout
        self.destination_ids = destination_ids
        self.address = address
        self.bytes_sent = 0
        self.blocks_sent = 0
        self.stats = stats if stats is not None else KVTransferStats()
        self._seq = 0
        self._call: grpc.aio.StreamStreamCall | None = None
        self._pending: dict[int, asyncio.Future[decode_pb2.KVAck]] = {}
        self._reader: asyncio.Task[None] | None = None
        self._failure: str | None = None

    async def open(self, metadata: tuple[tuple[str, str], ...] | None = None) -> None:
        """Start the stream (``metadata``: the trace context of the ``kv_transfer`` span) with its header."""
        self._call = self.stub.TransferKV(metadata=metadata)
        self._reader = asyncio.create_task(self._read_acks())
        await self._send(decode_pb2.KVTransferMessage(
            header=decode_pb2.KVHeader(request_id=self.request_id, layout=self.layout)))

    async def send_blocks(self, first_index: int, count: int, payload: bytes, max_payload: int) -> None:
        """Blocks ``first_index ..`` of the prompt (their bytes back to back) to their granted ids."""
        per_block = len(payload) // count
        per_message = max(1, max_payload // per_block)
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

    async def commit(self, first_token_id: int, num_computed_tokens: int) -> None:
        """Send the commit and wait until every message, the commit last, is acknowledged."""
        started = time.perf_counter()
        future = await self._send(decode_pb2.KVTransferMessage(commit=decode_pb2.KVCommit(
            request_id=self.request_id, first_token_id=first_token_id, num_computed_tokens=num_computed_tokens)))
        await asyncio.gather(*self._pending.values(), future)
        self.stats.add(0, 0, time.perf_counter() - started)
        self._raise_if_failed()

    async def close(self) -> None:
        if self._call is not None:
            with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
                await self._call.done_writing()
            self._call.cancel()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader

    async def _send(self, message: decode_pb2.KVTransferMessage) -> asyncio.Future[decode_pb2.KVAck]:
        self._raise_if_failed()
        self._seq += 1
        message.seq = self._seq
        future: asyncio.Future[decode_pb2.KVAck] = asyncio.get_running_loop().create_future()
        self._pending[self._seq] = future
        try:
            await self._call.write(message)
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as exc:
            self._fail(f"stream broke: {exc}")
            self._raise_if_failed()
        return future

    async def _read_acks(self) -> None:
        try:
            async for ack in self._call:
                future = self._pending.pop(ack.seq, None)
                if ack.error:
                    self._fail(f"{_CODE_NAMES.get(ack.code, 'ERROR')}: {ack.error}")
                    return
                if future is not None and not future.done():
                    future.set_result(ack)
            self._fail("stream ended early")
        except grpc.aio.AioRpcError as exc:
            self._fail(f"{exc.code().name}: {exc.details()}")

    def _fail(self, reason: str) -> None:
        if self._failure is None:
            self._failure = reason
        for future in self._pending.values():
            if not future.done():
                future.set_exception(UnavailableError(f"decode node {self.address}: {reason}"))
        self._pending.clear()

    def _raise_if_failed(self) -> None:
        if self._failure is not None:
            raise UnavailableError(f"decode node {self.address}: {self._failure}")

"""The decode node's logic: reservations for prefill nodes, KV received into them, decoding, token streams.

Control calls run on the engine thread through :class:`EngineWorker`; KV bytes are written into granted
blocks from the event loop (no step touches a block before its request is committed). Each request has
a :class:`TokenStream` from its reservation on: decoded tokens are buffered there until the gateway
attaches, and the stream ends with the finish reason and usage.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import structlog

from kvcache.kv_bytes import write_blocks
from services.common.errors import FailedPreconditionError, NotFoundError, UnavailableError
from services.engine.engine import LLMEngine
from services.engine.outputs import RequestOutput
from services.engine.reservations import Refusal, Reservation
from services.engine.sampling_params import SamplingParams
from services.engine.worker import EngineWorker

log = structlog.get_logger(__name__)


@dataclass
class TokenEvent:
    token_ids: list[int]
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


@dataclass
class TokenStream:
    queue: asyncio.Queue[TokenEvent] = field(default_factory=asyncio.Queue)
    attached: bool = False


@dataclass(frozen=True)
class Grant:
    block_ids: list[int]
    num_cached_blocks: int
    lease_deadline_unix_ms: int


class DecodeNode:
    def __init__(self, engine: LLMEngine, default_lease_s: float = 10.0, num_threads: int | None = None):
        self.engine = engine
        self.default_lease_s = default_lease_s
        self.worker = EngineWorker(engine, self._deliver, on_tick=self._expire, num_threads=num_threads)
        self.streams: dict[str, TokenStream] = {}
        self.draining = False

    def start(self) -> None:
        self.worker.start()

    async def stop(self) -> None:
        await self.worker.stop()

    # ---- reservations and KV --------------------------------------------------------------------
    async def reserve(self, request_id: str, prompt_ids: list[int], sampling: SamplingParams,
                      lease_s: float | None) -> Grant | Refusal:
        if self.draining:
            raise UnavailableError("decode node is draining")
        lease_s = min(lease_s or self.default_lease_s, self.default_lease_s)  # this node's setting caps it
        result = await self.worker.call(lambda e: e.reserve(request_id, prompt_ids, sampling, lease_s))
        if isinstance(result, Refusal):
            return result
        self.streams[request_id] = TokenStream()
        return Grant(list(result.block_ids), result.num_cached_blocks, _unix_ms(lease_s))

    async def receive(self, request_id: str, block_ids: list[int], payload: bytes) -> int:
        """Check and mark ``block_ids`` on the engine thread, then write their bytes. Returns the lease."""
        reservation: Reservation = await self.worker.call(lambda e: e.reservations.receive(request_id, block_ids))
        try:
            write_blocks(self.engine.runner.kv_cache, block_ids, payload)
        except ValueError as exc:
            await self.abort(request_id)
            raise FailedPreconditionError(f"{request_id}: {exc}") from exc
        return _unix_ms(reservation.lease_s)

    async def commit(self, request_id: str, first_token_id: int) -> None:
        await self.worker.call(lambda e: e.commit(request_id, first_token_id))

    async def abort(self, request_id: str) -> bool:
        found = await self.worker.call(lambda e: e.discard(request_id))
        stream = self.streams.pop(request_id, None)
        if stream is not None:
            stream.queue.put_nowait(TokenEvent([], finish_reason="abort"))
        return found or stream is not None

    # ---- tokens to the gateway ------------------------------------------------------------------
    async def attach(self, request_id: str) -> AsyncIterator[TokenEvent]:
        stream = self.streams.get(request_id)
        if stream is None or stream.attached:
            raise NotFoundError(f"decode node holds no request {request_id!r} to attach to")
        stream.attached = True
        finished = False
        try:
            while True:
                event = await stream.queue.get()
                yield event
                if event.finish_reason is not None:
                    finished = True
                    return
        finally:
            self.streams.pop(request_id, None)
            if not finished:  # the gateway went away: nobody wants the rest
                await self.abort(request_id)

    def _deliver(self, payload: list[RequestOutput] | tuple[str, list[str]]) -> None:
        if isinstance(payload, tuple):  # leases that expired
            for request_id in payload[1]:
                log.warning("reservation lease expired", request_id=request_id)
                stream = self.streams.pop(request_id, None)
                if stream is not None:
                    stream.queue.put_nowait(TokenEvent([], finish_reason="abort"))
            return
        for out in payload:
            stream = self.streams.get(out.request_id)
            if stream is None:
                continue
            event = TokenEvent(list(out.new_token_ids))
            if out.finished:
                event.finish_reason = out.finish_reason
                event.prompt_tokens, event.completion_tokens = out.prompt_tokens, out.completion_tokens
                event.cached_tokens = out.cached_tokens
            stream.queue.put_nowait(event)

    @staticmethod
    def _expire(engine: LLMEngine) -> tuple[str, list[str]] | None:
        expired = engine.reservations.expire()
        return ("expired", expired) if expired else None

    async def drain(self, timeout_s: float = 30.0) -> None:
        """Refuse new reservations; let running requests finish (up to ``timeout_s``), then abort the rest."""
        self.draining = True
        deadline = time.monotonic() + timeout_s
        while self.streams and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for request_id in list(self.streams):
            await self.abort(request_id)


def _unix_ms(after_s: float) -> int:
    return int((time.time() + after_s) * 1000)

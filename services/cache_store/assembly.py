"""Reassembling a put stream's chunks into whole blocks, and splitting blocks into chunks for a get.

A put stream is a sequence of (header | None, data) chunks: a header starts a block, data extends the
current one. ``PutAssembler`` enforces the framing (no data before a header, no more bytes than
announced, every block complete when the next starts or the stream ends) and the staging budget; the
checksums are verified by ``BlockStore.put``, which stores all blocks or none.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from services.cache_store.errors import CorruptBlockError, MalformedPutError, StoreFullError
from services.cache_store.store import CHECKSUMS, StoredBlock


@dataclass(frozen=True)
class BlockHeader:
    key: bytes
    total_length: int
    checksum_algorithm: str
    checksum: bytes
    layout: bytes = b""

    def validate(self) -> None:
        if not self.key:
            raise MalformedPutError("key", "a block header needs a non-empty key")
        if self.total_length <= 0:
            raise MalformedPutError("total_length", f"block {self.key.hex()}: must be > 0")
        if self.checksum_algorithm not in CHECKSUMS:
            raise MalformedPutError("checksum_algorithm",
                                    f"block {self.key.hex()}: {self.checksum_algorithm!r} is not one of "
                                    f"{sorted(CHECKSUMS)}")
        if not self.checksum:
            raise MalformedPutError("checksum", f"block {self.key.hex()}: missing")


@dataclass
class _Pending:
    header: BlockHeader
    parts: list[bytes] = field(default_factory=list)
    received: int = 0


class PutAssembler:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.staged_bytes = 0
        self._done: list[StoredBlock] = []
        self._current: _Pending | None = None

    def add(self, header: BlockHeader | None, data: bytes) -> None:
        if header is not None:
            header.validate()
            self._close_current()
            if self.staged_bytes + header.total_length > self.max_bytes:
                raise StoreFullError(f"put of more than {self.max_bytes} bytes (the store's capacity)")
            self.staged_bytes += header.total_length
            self._current = _Pending(header)
        if not data:
            return
        current = self._current
        if current is None:
            raise MalformedPutError("key", "data before the first block header")
        if current.received + len(data) > current.header.total_length:
            raise MalformedPutError("data", f"block {current.header.key.hex()}: more than total_length = "
                                            f"{current.header.total_length} bytes")
        current.parts.append(data)
        current.received += len(data)

    def finish(self) -> list[StoredBlock]:
        """The stream ended: every block it announced, complete (checksums not yet verified)."""
        self._close_current()
        return self._done

    def _close_current(self) -> None:
        current, self._current = self._current, None
        if current is None:
            return
        header = current.header
        if current.received != header.total_length:
            raise CorruptBlockError(f"block {header.key.hex()} truncated: {current.received} of "
                                    f"{header.total_length} bytes")
        data = current.parts[0] if len(current.parts) == 1 else b"".join(current.parts)
        self._done.append(
            StoredBlock(header.key, data, header.checksum_algorithm, header.checksum, header.layout)
        )


def split(data: bytes, chunk_bytes: int) -> Iterator[bytes]:
    """``data`` in pieces of at most ``chunk_bytes`` (one piece for a small block)."""
    if len(data) <= chunk_bytes:
        yield data
        return
    view = memoryview(data)
    for start in range(0, len(data), chunk_bytes):
        yield bytes(view[start : start + chunk_bytes])

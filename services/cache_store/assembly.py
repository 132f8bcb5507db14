"""Reassembling a put stream's chunks into whole blocks, and splitting blocks into chunks for a get.

A put stream is a sequence of (header | None, data) chunks: a header starts a block, data extends the
current one. ``PutAssembler`` enforces the framing (no data before a header, no more bytes than
announced, every block complete when the next starts or the stream ends, no key twice), the header contract of
``cache_store.proto`` (32-byte keys, a layout of the key's model) and the staging budget, and verifies
each block's checksum as it completes and takes the store's digest of it (``block.digest_of``, the cost spread
over the stream); ``BlockStore.put`` then stores all blocks or none.

Staging budget: a put's blocks are held in memory until it ends. Besides the most one put may bring
(``max_bytes``, the memory tier's capacity), a :class:`StagingBudget` shared by every put of the store
bounds the bytes staged by unfinished puts in all (twice the memory tier's capacity) and per caller (the
capacity: half the budget): twelve stalled streams of 60 MiB each into a 64 MiB tier once grew the
process by a gigabyte. A block header that would pass either bound is
refused ``StoreFullError`` before its data is taken in; the bytes a block header announces are reserved
when it arrives and given back when the put ends, stored or not (:meth:`PutAssembler.release`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from services.cache_store.block import CHECKSUMS, Layout, StoredBlock, digest_of
from services.cache_store.errors import CorruptBlockError, MalformedPutError, StoreFullError
from services.cache_store.keys import FINGERPRINT_BYTES, KEY_BYTES, fingerprint_of


@dataclass(frozen=True)
class BlockHeader:
    key: bytes
    total_length: int
    checksum_algorithm: str
    checksum: bytes
    layout: Layout | None = None

    def validate(self) -> None:
        if len(self.key) != KEY_BYTES:
            raise MalformedPutError("key", f"must be {KEY_BYTES} bytes (model fingerprint ‖ block id), got "
                                           f"{len(self.key)}")
        if self.total_length <= 0:
            raise MalformedPutError("total_length", f"block {self.key.hex()}: must be > 0")
        if self.checksum_algorithm not in CHECKSUMS:
            raise MalformedPutError("checksum_algorithm",
                                    f"block {self.key.hex()}: {self.checksum_algorithm!r} is not one of "
                                    f"{sorted(CHECKSUMS)}")
        if not self.checksum:
            raise MalformedPutError("checksum", f"block {self.key.hex()}: missing")
        layout = self.layout
        if layout is None:
            raise MalformedPutError("layout", f"block {self.key.hex()}: a block header needs its KVLayout")
        if layout.model_fingerprint != fingerprint_of(self.key):
            raise MalformedPutError(
                "layout.model_fingerprint",
                f"block {self.key.hex()}: key for another model (the key's first {FINGERPRINT_BYTES} bytes "
                f"are {fingerprint_of(self.key).hex()}, layout.model_fingerprint is "
                f"{layout.model_fingerprint.hex()})")
        if layout.bytes_per_block and self.total_length != layout.bytes_per_block:
            raise MalformedPutError("total_length", f"block {self.key.hex()}: {self.total_length} bytes, its "
                                                    f"layout says bytes_per_block = {layout.bytes_per_block}")


@dataclass
class _Pending:
    header: BlockHeader
    parts: list[bytes | memoryview] = field(default_factory=list)
    received: int = 0
    closed: bool = False


class StagingBudget:
    """Bytes staged by unfinished puts: at most ``total_bytes`` in all and ``per_caller_bytes`` per caller."""

    def __init__(self, total_bytes: int, per_caller_bytes: int) -> None:
        assert 0 < per_caller_bytes <= total_bytes, f"per-caller share {per_caller_bytes} of {total_bytes}"
        self.total_bytes = total_bytes
        self.per_caller_bytes = per_caller_bytes
        self.staged_bytes = 0
        self._by_caller: dict[str, int] = {}

    def staged_by(self, caller: str) -> int:
        return self._by_caller.get(caller, 0)

    def reserve(self, caller: str, nbytes: int) -> None:
        """Take ``nbytes`` for ``caller``, or ``StoreFullError`` naming the bound (nothing taken)."""
        mine = self.staged_by(caller)
        if mine + nbytes > self.per_caller_bytes:
            raise StoreFullError(
                f"a block of {nbytes} bytes would take the unfinished puts of {caller} to {mine + nbytes} bytes "
                f"staged, past {self.per_caller_bytes} bytes per caller (the memory tier's capacity)")
        if self.staged_bytes + nbytes > self.total_bytes:
            raise StoreFullError(
                f"a block of {nbytes} bytes would take the unfinished puts of every caller to "
                f"{self.staged_bytes + nbytes} bytes staged, past {self.total_bytes} bytes (twice the memory "
                f"tier's capacity); try again once some have finished")
        self._by_caller[caller] = mine + nbytes
        self.staged_bytes += nbytes

    def release(self, caller: str, nbytes: int) -> None:
        mine = self._by_caller.get(caller, 0) - nbytes
        assert mine >= 0 and self.staged_bytes >= nbytes, f"{caller} releases {nbytes} bytes it did not stage"
        if mine:
            self._by_caller[caller] = mine
        else:
            self._by_caller.pop(caller, None)
        self.staged_bytes -= nbytes


class PutAssembler:
    """Feed a put stream's chunks in order; each block is verified as soon as its last byte arrives and
    handed to ``on_block`` (the store stages it on disk under write-through), so the work of a large put
    is spread over its stream instead of stalling the event loop at its end."""

    def __init__(self, max_bytes: int, on_block: Callable[[StoredBlock], None] | None = None,
                 budget: StagingBudget | None = None, caller: str = "") -> None:
        self.max_bytes = max_bytes
        self.on_block = on_block
        self.budget = budget  # shared with the store's other puts; ``release`` when the put ends, either way
        self.caller = caller
        self.staged_bytes = 0
        self._reserved = 0  # of ``staged_bytes``, taken from ``budget`` and not yet given back
        self._done: list[StoredBlock] = []
        self._current: _Pending | None = None
        self._keys: set[bytes] = set()  # a key twice in one put is refused: which bytes would it store?

    def add(self, header: BlockHeader | None, data: bytes | memoryview) -> None:
        if header is not None:
            header.validate()
            if header.key in self._keys:
                raise MalformedPutError("key", f"block {header.key.hex()} comes twice in this put")
            self._keys.add(header.key)
            self._close_current()
            if self.staged_bytes + header.total_length > self.max_bytes:
                raise StoreFullError(f"put of more than {self.max_bytes} bytes (the store's capacity)")
            if self.budget is not None:
                self.budget.reserve(self.caller, header.total_length)
                self._reserved += header.total_length
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
        if current.received == current.header.total_length:
            self._close_current(keep=True)

    def release(self) -> None:
        """Give the staged bytes back to the budget: the put ended (stored, refused, failed or cut)."""
        if self.budget is not None and self._reserved:
            self.budget.release(self.caller, self._reserved)
        self._reserved = 0

    def finish(self) -> list[StoredBlock]:
        """The stream ended: every block it announced, complete and verified."""
        self._close_current()
        return self._done

    def _close_current(self, keep: bool = False) -> None:
        current = self._current
        self._current = current if keep else None
        if current is None or current.closed:
            return
        header = current.header
        if current.received != header.total_length:
            raise CorruptBlockError(f"block {header.key.hex()} truncated: {current.received} of "
                                    f"{header.total_length} bytes")
        current.closed = True
        data = current.parts[0] if len(current.parts) == 1 else b"".join(current.parts)
        current.parts = []
        block = StoredBlock(header.key, data, header.checksum_algorithm, header.checksum,
                            header.layout.encoded if header.layout else b"")
        block.verify()
        block = replace(block, digest=digest_of(block.checksum_algorithm, block.checksum))  # verified above
        self._done.append(block)
        if self.on_block is not None:
            self.on_block(block)


def split(data: bytes | memoryview, chunk_bytes: int) -> Iterator[bytes | memoryview]:
    """``data`` in pieces of at most ``chunk_bytes``, uncopied (one piece for a small block)."""
    if len(data) <= chunk_bytes:
        yield data
        return
    view = memoryview(data)
    for start in range(0, len(data), chunk_bytes):
        yield view[start : start + chunk_bytes]

"""The cache-store's message framing: blocks → ``PutChunk``s, ``GetChunk``s → blocks, both ends.

A block travels as consecutive chunks of at most ``CHUNK_BYTES`` of data, the first carrying its header
(key, length, checksum, layout). Checksums are crc32 (``zlib``), verified on arrival.

Bulk data skips protobuf's copies: a chunk is encoded as its header fields (a ``PutChunk``/``GetChunk``
without data, serialized) followed by the ``data`` field written by hand, which is the same wire format
protobuf writes (fields in number order, ``data`` = 6 last); a received chunk is split into its header
message and a zero-copy ``memoryview`` of its data (:func:`split_data`, any field order accepted). The
stubs that use these pass bytes through gRPC unchanged (``*_frame`` functions).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Sequence
from typing import NamedTuple

from google.protobuf.message import DecodeError
from pdserve.v1 import cache_store_pb2, node_pb2

from services.cache_store.errors import CorruptBlockError

CHUNK_BYTES = 2 << 20
CRC32 = cache_store_pb2.CHECKSUM_ALGORITHM_CRC32
DATA_FIELD = 6
_DATA_TAG = bytes([DATA_FIELD << 3 | 2])  # field 6, length-delimited
END_OF_PUT = cache_store_pb2.PutChunk(end_of_put=True).SerializeToString()
"""A put's last chunk: the client finished the put (a stream that ends without it was cut)."""
PUT_END_METADATA = ("pdserve-put-end", "1")
"""Call metadata of a put that ends with :data:`END_OF_PUT`: the store then refuses one that ends without
it. A put without it (a client from before the marker, during a rolling update) is stored as before."""


def put_metadata(trace: tuple[tuple[str, str], ...] | None) -> tuple[tuple[str, str], ...]:
    """A put call's metadata: :data:`PUT_END_METADATA` and the trace context ``trace``."""
    return (PUT_END_METADATA, *(trace or ()))
Block = tuple[bytes, "bytes | memoryview"]
"""``(key, data)``."""


class PutFrame(NamedTuple):
    """A received ``PutChunk``: its header fields (``data`` empty) and its data, uncopied."""

    message: cache_store_pb2.PutChunk
    data: memoryview


class GetFrame(NamedTuple):
    message: cache_store_pb2.GetChunk
    data: memoryview


def crc32(data: bytes | memoryview) -> bytes:
    return zlib.crc32(data).to_bytes(4, "big")


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _read_varint(raw: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(raw) or shift > 63:
            raise DecodeError("truncated varint")
        byte = raw[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def encode_chunk(header: bytes, data: bytes | memoryview) -> bytes:
    """A serialized chunk: ``header`` (the chunk's other fields, serialized) then ``data`` as field 6."""
    return b"".join((header, _DATA_TAG, _varint(len(data)), data))


def split_data(raw: bytes) -> tuple[bytes, memoryview]:
    """A serialized chunk → (its other fields, still serialized; its ``data`` as a view of ``raw``)."""
    view = memoryview(raw)
    data, header, kept_from, pos = view[:0], [], 0, 0
    while pos < len(raw):
        field_start = pos
        tag, pos = _read_varint(raw, pos)
        wire_type = tag & 7
        if wire_type == 0:
            _, pos = _read_varint(raw, pos)
        elif wire_type == 1:
            pos += 8
        elif wire_type == 5:
            pos += 4
        elif wire_type == 2:
            length, pos = _read_varint(raw, pos)
            if tag >> 3 == DATA_FIELD:  # the last occurrence wins, as in protobuf
                header.append(raw[kept_from:field_start])
                data, kept_from = view[pos:pos + length], pos + length
            pos += length
        else:
            raise DecodeError(f"unexpected wire type {wire_type}")
    if pos != len(raw):
        raise DecodeError("truncated message")
    header.append(raw[kept_from:])
    return b"".join(header), data


def parse_put_frame(raw: bytes) -> PutFrame:
    header, data = split_data(raw)
    return PutFrame(cache_store_pb2.PutChunk.FromString(header), data)


def parse_get_frame(raw: bytes) -> GetFrame:
    header, data = split_data(raw)
    return GetFrame(cache_store_pb2.GetChunk.FromString(header), data)


def put_frames(blocks: Sequence[Block], layout: node_pb2.KVLayout | None,
               chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
    """Serialized ``PutChunk``s of ``blocks``, then :data:`END_OF_PUT` (without it nothing is stored)."""
    for key, data in blocks:
        view = memoryview(data).cast("B")
        header = cache_store_pb2.PutChunk(key=key, total_length=len(view), checksum_algorithm=CRC32,
                                          checksum=crc32(view), layout=layout).SerializeToString()
        yield encode_chunk(header, view[:chunk_bytes])
        for start in range(chunk_bytes, len(view), chunk_bytes):
            yield encode_chunk(b"", view[start:start + chunk_bytes])
    yield END_OF_PUT


def put_chunks(blocks: Sequence[Block], layout: node_pb2.KVLayout | None,
               chunk_bytes: int = CHUNK_BYTES) -> Iterator[cache_store_pb2.PutChunk]:
    """``PutChunk`` messages of ``blocks`` (for stubs that serialize; :func:`put_frames` copies less)."""
    for frame in put_frames(blocks, layout, chunk_bytes):
        yield cache_store_pb2.PutChunk.FromString(frame)


class BlockAssembler:
    """Feed ``GetChunk``s (messages or :class:`GetFrame`s) in order; whole, verified blocks come out of
    :meth:`add` and :meth:`finish`."""

    def __init__(self) -> None:
        self._header: cache_store_pb2.GetChunk | None = None
        self._parts: list[bytes | memoryview] = []

    def add(self, chunk: cache_store_pb2.GetChunk | GetFrame) -> tuple[bytes, bytes] | None:
        message, data = (chunk.message, chunk.data) if isinstance(chunk, GetFrame) else (chunk, chunk.data)
        done = None
        if message.key:
            done = self._close()
            self._header, self._parts = message, []
        elif self._header is None:
            raise CorruptBlockError("cache-store sent data before a block header")
        self._parts.append(data)
        return done

    def finish(self) -> tuple[bytes, bytes] | None:
        return self._close()

    def _close(self) -> tuple[bytes, bytes] | None:
        header, self._header = self._header, None
        if header is None:
            return None
        data = bytes(self._parts[0]) if len(self._parts) == 1 else b"".join(self._parts)
        if len(data) != header.total_length or (header.checksum_algorithm == CRC32 and crc32(data) != header.checksum):
            raise CorruptBlockError(f"block {header.key.hex()} arrived damaged from the cache-store")
        return header.key, data

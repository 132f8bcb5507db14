"""PutAssembler framing: headers start blocks, data extends them, every block must arrive whole."""

from __future__ import annotations

import pytest

from services.cache_store.assembly import BlockHeader, PutAssembler, split
from services.cache_store.errors import CorruptBlockError, MalformedPutError, StoreFullError
from services.cache_store.store import checksum


def header(key: bytes, data: bytes) -> BlockHeader:
    return BlockHeader(key, len(data), "crc32", checksum("crc32", data))


def test_blocks_reassemble_from_chunks():
    one, two = bytes(range(200)) * 5, b"xyz"
    assembler = PutAssembler(max_bytes=10_000)
    pieces = list(split(one, 300))
    assert [len(p) for p in pieces] == [300, 300, 300, 100]
    assembler.add(header(b"one", one), pieces[0])
    for piece in pieces[1:]:
        assembler.add(None, piece)
    assembler.add(header(b"two", two), b"")  # header-only chunk, data follows
    assembler.add(None, two)
    blocks = assembler.finish()
    assert [(b.key, b.data) for b in blocks] == [(b"one", one), (b"two", two)]
    for b in blocks:
        b.verify()


def test_truncated_block_is_data_loss():
    assembler = PutAssembler(max_bytes=100)
    assembler.add(header(b"k", b"0123456789"), b"01234")
    with pytest.raises(CorruptBlockError, match="truncated: 5 of 10"):
        assembler.finish()


def test_truncated_block_detected_when_next_starts():
    assembler = PutAssembler(max_bytes=100)
    assembler.add(header(b"a", b"0123456789"), b"0123")
    with pytest.raises(CorruptBlockError, match="truncated"):
        assembler.add(header(b"b", b"x"), b"x")


@pytest.mark.parametrize(
    ("first", "field"),
    [
        ((None, b"data"), "key"),
        ((BlockHeader(b"", 4, "crc32", b"1234"), b"data"), "key"),
        ((BlockHeader(b"k", 0, "crc32", b"1234"), b""), "total_length"),
        ((BlockHeader(b"k", 4, "unspecified", b"1234"), b"data"), "checksum_algorithm"),
        ((BlockHeader(b"k", 4, "crc32", b""), b"data"), "checksum"),
        ((BlockHeader(b"k", 2, "crc32", b"1234"), b"data"), "data"),
    ],
)
def test_malformed_stream_names_the_field(first, field):
    with pytest.raises(MalformedPutError, match=f"^{field}: "):
        PutAssembler(max_bytes=100).add(*first)


def test_staging_is_bounded_by_capacity():
    assembler = PutAssembler(max_bytes=10)
    assembler.add(header(b"a", b"123456"), b"123456")
    with pytest.raises(StoreFullError):
        assembler.add(header(b"b", b"123456"), b"")


def test_empty_stream_is_an_empty_put():
    assert PutAssembler(max_bytes=10).finish() == []

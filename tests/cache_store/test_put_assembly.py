"""PutAssembler framing: headers start blocks, data extends them, every block must arrive whole; headers
follow the key contract (32-byte keys, a layout of the key's model)."""

from __future__ import annotations

import pytest

from services.cache_store.assembly import BlockHeader, PutAssembler, split
from services.cache_store.block import Layout, checksum
from services.cache_store.errors import CorruptBlockError, MalformedPutError, StoreFullError
from tests.cache_store.helpers import FP, LAYOUT_BYTES, OTHER_FP, key

LAYOUT = Layout(LAYOUT_BYTES, FP)


def header(name: str, data: bytes) -> BlockHeader:
    return BlockHeader(key(name), len(data), "crc32", checksum("crc32", data), LAYOUT)


def bad(key_: bytes = key("k"), total_length: int = 4, algorithm: str = "crc32", checksum_: bytes = b"1234",
        layout: Layout | None = LAYOUT) -> BlockHeader:
    return BlockHeader(key_, total_length, algorithm, checksum_, layout)


def test_blocks_reassemble_from_chunks():
    one, two = bytes(range(200)) * 5, b"xyz"
    assembler = PutAssembler(max_bytes=10_000)
    pieces = list(split(one, 300))
    assert [len(p) for p in pieces] == [300, 300, 300, 100]
    assembler.add(header("one", one), pieces[0])
    for piece in pieces[1:]:
        assembler.add(None, piece)
    assembler.add(header("two", two), b"")  # header-only chunk, data follows
    assembler.add(None, two)
    blocks = assembler.finish()
    assert [(b.key, b.data, b.layout) for b in blocks] == [(key("one"), one, LAYOUT_BYTES),
                                                           (key("two"), two, LAYOUT_BYTES)]
    for b in blocks:
        b.verify()


def test_truncated_block_is_data_loss():
    assembler = PutAssembler(max_bytes=100)
    assembler.add(header("k", b"0123456789"), b"01234")
    with pytest.raises(CorruptBlockError, match="truncated: 5 of 10"):
        assembler.finish()


def test_truncated_block_detected_when_next_starts():
    assembler = PutAssembler(max_bytes=100)
    assembler.add(header("a", b"0123456789"), b"0123")
    with pytest.raises(CorruptBlockError, match="truncated"):
        assembler.add(header("b", b"x"), b"x")


@pytest.mark.parametrize(
    ("first", "field"),
    [
        ((None, b"data"), "key"),
        ((bad(key_=b""), b"data"), "key"),
        ((bad(key_=b"k" * 16), b"data"), "key"),
        ((bad(key_=key("k") + b"x"), b"data"), "key"),
        ((bad(total_length=0), b""), "total_length"),
        ((bad(algorithm="unspecified"), b"data"), "checksum_algorithm"),
        ((bad(checksum_=b""), b"data"), "checksum"),
        ((bad(layout=None), b"data"), "layout"),
        ((bad(key_=key("k", OTHER_FP)), b"data"), "layout.model_fingerprint"),
        ((bad(layout=Layout(LAYOUT_BYTES, FP, bytes_per_block=5)), b"data"), "total_length"),
        ((bad(total_length=2), b"data"), "data"),
    ],
)
def test_malformed_stream_names_the_field(first, field):
    with pytest.raises(MalformedPutError, match=f"^{field}: "):
        PutAssembler(max_bytes=100).add(*first)


def test_a_key_twice_in_one_put_is_refused_by_name():
    """Which of the two would be stored? Neither: the put fails (and stores nothing, as any bad put)."""
    assembler = PutAssembler(max_bytes=100)
    assembler.add(header("a", b"one"), b"one")
    with pytest.raises(MalformedPutError, match=r"^key: block .* comes twice in this put"):
        assembler.add(header("a", b"two"), b"two")


def test_key_for_another_model_says_so():
    with pytest.raises(MalformedPutError, match="key for another model"):
        PutAssembler(max_bytes=100).add(bad(key_=key("k", OTHER_FP)), b"data")


def test_bytes_per_block_is_checked_only_when_stated():
    assembler = PutAssembler(max_bytes=100)
    assembler.add(bad(layout=Layout(LAYOUT_BYTES, FP, bytes_per_block=4), checksum_=checksum("crc32", b"data")),
                  b"data")
    assert len(assembler.finish()) == 1


def test_staging_is_bounded_by_capacity():
    assembler = PutAssembler(max_bytes=10)
    assembler.add(header("a", b"123456"), b"123456")
    with pytest.raises(StoreFullError):
        assembler.add(header("b", b"123456"), b"")


def test_empty_stream_is_an_empty_put():
    assert PutAssembler(max_bytes=10).finish() == []


def test_each_block_is_verified_and_handed_on_as_its_last_byte_arrives():
    seen: list[bytes] = []
    assembler = PutAssembler(max_bytes=100, on_block=lambda block: seen.append(block.key))
    assembler.add(header("a", b"0123456789"), b"01234")
    assert seen == []
    assembler.add(None, b"56789")
    assert seen == [key("a")]  # before the next header or the end of the stream
    with pytest.raises(MalformedPutError, match=r"^data: "):
        assembler.add(None, b"!")
    bad = BlockHeader(key("b"), 3, "crc32", checksum("crc32", b"xyz"), LAYOUT)
    with pytest.raises(CorruptBlockError, match="checksum mismatch"):
        assembler.add(bad, b"xyZ")
    assert seen == [key("a")]


def test_an_unknown_checksum_enum_is_named_by_its_number():
    from pdserve.v1 import cache_store_pb2

    from services.cache_store.servicer import _header_of

    header = _header_of(cache_store_pb2.PutChunk(key=key("a"), total_length=4, checksum=b"x", checksum_algorithm=7))
    with pytest.raises(MalformedPutError, match="'enum value 7' is not one of"):
        header.validate()

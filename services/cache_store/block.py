"""A stored block and its checksums (no gRPC here).

A block is its 32-byte key (:mod:`services.cache_store.keys`), its bytes, the checksum they were verified
against and its layout (a serialized ``KVLayout``, opaque to the store and returned as given).
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from services.cache_store.errors import CorruptBlockError, MalformedPutError

CHECKSUMS: dict[str, Callable[[bytes | memoryview], bytes]] = {
    "crc32": lambda data: zlib.crc32(data).to_bytes(4, "big"),
    "blake2b-128": lambda data: hashlib.blake2b(data, digest_size=16).digest(),
}
CHECKSUM_IDS = {"crc32": 1, "blake2b-128": 2}  # the proto's enum numbers; also the disk format's
MAX_CHECKSUM_BYTES = 16


def checksum(algorithm: str, data: bytes | memoryview) -> bytes:
    if algorithm not in CHECKSUMS:
        raise MalformedPutError("checksum_algorithm", f"{algorithm!r} is not one of {sorted(CHECKSUMS)}")
    return CHECKSUMS[algorithm](data)


@dataclass(frozen=True)
class Layout:
    """What the store checks of a put's ``KVLayout``; ``encoded`` is the message, kept as given."""

    encoded: bytes
    model_fingerprint: bytes
    bytes_per_block: int = 0  # 0 = not stated


@dataclass(frozen=True)
class StoredBlock:
    key: bytes
    data: bytes | memoryview  # a view of the received message, uncopied
    checksum_algorithm: str
    checksum: bytes
    layout: bytes = b""  # opaque (a serialized KVLayout); returned as given

    def verify(self) -> None:
        """Raise ``CorruptBlockError`` unless ``data`` matches ``checksum``."""
        actual = checksum(self.checksum_algorithm, self.data)
        if actual != self.checksum:
            raise CorruptBlockError(
                f"block {self.key.hex()}: {self.checksum_algorithm} checksum mismatch "
                f"(expected {self.checksum.hex()}, got {actual.hex()})"
            )

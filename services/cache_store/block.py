"""A stored block and its checksums (no gRPC here).

A block is its 32-byte key (:mod:`services.cache_store.keys`), its bytes, the checksum they were verified
against and its layout (a serialized ``KVLayout``, opaque to the store and returned as given), plus what
the store adds when it accepts the block:

- ``digest``: the store's own SHA-256 of the bytes, computed once at Put and kept with the block in either
  tier. A Get re-checks it before sending the block (:meth:`StoredBlock.intact`): bytes that changed since
  (memory or a disk file) are never served. It is also how a Put of a stored key tells the same bytes from
  different ones (first writer wins: :meth:`BlockStore.put`). The client's checksum (crc32 on the wire)
  only guards the transfer; SHA-256 is what the store trusts.
- ``writer``: who put it (:mod:`services.cache_store.writers`); only that caller may delete it.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace

from services.cache_store.errors import CorruptBlockError, MalformedPutError

CHECKSUMS: dict[str, Callable[[bytes | memoryview], bytes]] = {
    "crc32": lambda data: zlib.crc32(data).to_bytes(4, "big"),
    "blake2b-128": lambda data: hashlib.blake2b(data, digest_size=16).digest(),
}
CHECKSUM_IDS = {"crc32": 1, "blake2b-128": 2}  # the proto's enum numbers; also the disk format's
MAX_CHECKSUM_BYTES = 16
DIGEST_BYTES = 32


def digest_of(data: bytes | memoryview) -> bytes:
    """The store's digest of a block's bytes (SHA-256: faster than blake2b where the CPU has SHA
    instructions)."""
    return hashlib.sha256(data).digest()


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
    digest: bytes = b""  # digest_of(data), set when the store accepts the block (BlockStore.put)
    writer: str = ""  # the caller that put it first (services.cache_store.writers); "" = in-process

    def sealed(self, writer: str) -> StoredBlock:
        """This block as the store keeps it: with its digest (computed unless set) and ``writer``."""
        return replace(self, digest=self.digest or digest_of(self.data), writer=writer)

    def intact(self) -> bool:
        """Whether ``data`` still matches the digest taken at Put."""
        return len(self.digest) == DIGEST_BYTES and digest_of(self.data) == self.digest

    def verify(self) -> None:
        """Raise ``CorruptBlockError`` unless ``data`` matches ``checksum``."""
        actual = checksum(self.checksum_algorithm, self.data)
        if actual != self.checksum:
            raise CorruptBlockError(
                f"block {self.key.hex()}: {self.checksum_algorithm} checksum mismatch "
                f"(expected {self.checksum.hex()}, got {actual.hex()})"
            )

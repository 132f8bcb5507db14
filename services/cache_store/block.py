"""A stored block and its checksums (no gRPC here).

A block is its 32-byte key (:mod:`services.cache_store.keys`), its bytes, the checksum they were verified
against and its layout (a serialized ``KVLayout``, opaque to the store and returned as given), plus what
the store adds when it accepts the block:

- ``digest``: the store's seal of the block, taken once at Put and kept with it in either tier: a SHA-256
  over the transfer checksum it verified the bytes against (crc32 or blake2b-128) and that checksum's
  algorithm — 32 bytes whatever the algorithm, and no second pass over the data (a SHA-256 of the data
  itself cost the store 0.5 CPU s/GB at Put and again at every Get). A Get re-checks it before sending the
  block (:meth:`StoredBlock.intact`: one checksum pass, crc32 at ~5 GB/s): bytes that changed since
  (memory or a disk file) are never served. It is also how a Put of a stored key tells the same bytes
  from different ones (first writer wins: :meth:`BlockStore.put`; the stored block is kept either way, so
  a crafted crc32 collision changes only what the answer counts).
- ``writer``: who put it (``services.common.tls.roles.caller_name``); only that caller may delete it.
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


def digest_of(algorithm: str, verified_checksum: bytes) -> bytes:
    """The store's seal of a block whose bytes were verified against ``verified_checksum`` (see the module
    docstring)."""
    return hashlib.sha256(bytes([CHECKSUM_IDS[algorithm]]) + verified_checksum).digest()


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
    writer: str = ""  # the caller that put it first (tls.roles.caller_name); "" = in-process

    def sealed(self, writer: str) -> StoredBlock:
        """This block as the store keeps it: with its digest (unless set: its checksum verified, then
        sealed) and ``writer``."""
        if self.digest:
            return replace(self, writer=writer)
        self.verify()
        return replace(self, digest=digest_of(self.checksum_algorithm, self.checksum), writer=writer)

    def intact(self) -> bool:
        """Whether ``data`` still matches the digest taken at Put (one pass of its checksum algorithm)."""
        if len(self.digest) != DIGEST_BYTES or self.checksum_algorithm not in CHECKSUMS:
            return False
        return digest_of(self.checksum_algorithm, checksum(self.checksum_algorithm, self.data)) == self.digest

    def verify(self) -> None:
        """Raise ``CorruptBlockError`` unless ``data`` matches ``checksum``."""
        actual = checksum(self.checksum_algorithm, self.data)
        if actual != self.checksum:
            raise CorruptBlockError(
                f"block {self.key.hex()}: {self.checksum_algorithm} checksum mismatch "
                f"(expected {self.checksum.hex()}, got {actual.hex()})"
            )

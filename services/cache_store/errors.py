"""Named errors of the cache-store core; the servicer maps them to gRPC status codes."""

from __future__ import annotations


class StoreError(Exception):
    """Base of every error the store raises on purpose."""


class MalformedPutError(StoreError):
    """The put stream breaks the protocol (data before a header, bad header, excess bytes).

    ``field`` names the offending field (maps to ``INVALID_ARGUMENT``)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


class InvalidKeyError(StoreError):
    """A Get, Lookup or Delete names a key that is not 32 bytes, one of another model, or one twice
    (``INVALID_ARGUMENT``)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


class CorruptBlockError(StoreError):
    """A block arrived truncated or does not match its checksum (maps to ``DATA_LOSS``)."""


class StoreFullError(StoreError):
    """The blocks do not fit even after evicting everything evictable: blocks being read are not; or a
    per-caller or store-wide bound (unfinished puts' staged bytes, one caller's leases) would be passed
    (maps to ``RESOURCE_EXHAUSTED``)."""


class DiskWriteError(StoreError):
    """A write-through put could not write its blocks to disk; nothing of it is stored
    (maps to ``UNAVAILABLE``)."""


class MissingBlockError(StoreError):
    """A requested key is not stored (maps to ``NOT_FOUND``)."""


class ForeignBlockError(StoreError):
    """A Delete names a block another caller wrote: nothing of the request is deleted
    (maps to ``PERMISSION_DENIED``)."""

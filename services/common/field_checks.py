"""Checks of the fields every internal message shares: request ids and peer addresses.

A peer may be buggy or hostile: each servicer runs these before any state changes, so a malformed field
is refused with ``INVALID_ARGUMENT`` naming it (``InvalidArgumentError``), whoever the caller is.
"""

from __future__ import annotations

from collections.abc import Sequence

from services.common.errors import InvalidArgumentError

MAX_REQUEST_ID_CHARS = 256
MAX_CLIENT_REQUEST_ID_CHARS = 224  # a client's id at the gateway: room for a retry's ``~retryN-xxxxxx`` suffix
MAX_ADDRESS_CHARS = 256
MAX_PEERS = 64  # decode candidates / peers one message may name


def check_request_id(request_id: str, field: str = "request_id", max_chars: int = MAX_REQUEST_ID_CHARS) -> None:
    """Non-empty, at most ``max_chars`` characters, all printable (no control characters, no newlines: ids
    go into logs and metric labels)."""
    if not request_id:
        raise InvalidArgumentError(field, "is required")
    if len(request_id) > max_chars:
        raise InvalidArgumentError(field, f"is {len(request_id)} characters, at most {max_chars}")
    if not request_id.isprintable():
        raise InvalidArgumentError(field, "has a non-printable character")


def check_addresses(addresses: Sequence[str], field: str) -> None:
    """At most :data:`MAX_PEERS` entries, each a printable ``host:port`` of at most
    :data:`MAX_ADDRESS_CHARS` characters with a port in 1..65535."""
    if len(addresses) > MAX_PEERS:
        raise InvalidArgumentError(field, f"{len(addresses)} entries, at most {MAX_PEERS}")
    for i, address in enumerate(addresses):
        if len(address) > MAX_ADDRESS_CHARS or not address.isprintable() or " " in address:
            raise InvalidArgumentError(f"{field}[{i}]", f"is not a host:port of at most {MAX_ADDRESS_CHARS} "
                                                        f"printable characters")
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidArgumentError(f"{field}[{i}]", "is not a host:port (a port in 1..65535)")

"""The process's cluster identity, set once at startup, and the channels every internal call opens.

``run_service`` sets the identity from ``--mtls-dir`` (or none, with ``--insecure``) before anything
connects, as it sets gRPC keepalive: every internal channel then comes from :func:`open_channel` /
:func:`open_sync_channel`, which present this process's certificate and verify the server's against the
cluster CA *and its role*. The channel checks the server's certificate for the DNS name
``<role>.pdserve.internal`` (``grpc.ssl_target_name_override``), so a caller reaches only a process that
holds a certificate of the role it meant to reach, whatever address it was given — a prefill node never
streams KV to a process that is not a decode node.

Without an identity (``--insecure``) channels are plaintext, as every port of such a process is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc
import grpc.aio

from services.common.tls.ca import ROLES, role_dns
from services.common.tls.identity import Identity

_identity: Identity | None = None


def set_identity(identity: Identity | None) -> None:
    """This process's identity from now on (None: plaintext, ``--insecure``)."""
    global _identity
    _identity = identity


def current_identity() -> Identity | None:
    return _identity


def _secure_options(role: str, options: Sequence[tuple[str, Any]]) -> list[tuple[str, Any]]:
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    return [*options, ("grpc.ssl_target_name_override", role_dns(role))]


def open_channel(address: str, role: str, options: Sequence[tuple[str, Any]] = (),
                 identity: Identity | bool | None = True) -> grpc.aio.Channel:
    """A ``grpc.aio`` channel to the process of ``role`` at ``address``; ``identity``: True = this process's
    (see module docstring), None = plaintext, or another one (tests acting as some role)."""
    chosen = _identity if identity is True else identity
    if chosen is None or chosen is False:
        return grpc.aio.insecure_channel(address, options=list(options))
    return grpc.aio.secure_channel(address, chosen.channel_credentials(), options=_secure_options(role, options))


def open_sync_channel(address: str, role: str, options: Sequence[tuple[str, Any]] = (),
                      identity: Identity | bool | None = True) -> grpc.Channel:
    """:func:`open_channel` for the synchronous API (launcher, CLI tools, the cache-store's sync client)."""
    chosen = _identity if identity is True else identity
    if chosen is None or chosen is False:
        return grpc.insecure_channel(address, options=list(options))
    return grpc.secure_channel(address, chosen.channel_credentials(), options=_secure_options(role, options))


def identity_generation() -> int:
    """Changes when this process's certificate files changed (a pool re-opens its channels then)."""
    if _identity is None:
        return 0
    _identity.current()  # notices changed files (at most every RECHECK_S)
    return _identity.generation

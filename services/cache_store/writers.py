"""Who is calling: the identity the store records as a block's writer, and checks a Delete against.

On an mTLS port (the default) it is the common name of the caller's verified certificate — one per
process (``decode-1``, ``prefill-2``: ``services.cluster`` issues them so), stable across certificate
rotation and restarts — written ``cn:<name>``. On a plaintext port (``--insecure``) there is no
certificate: the peer's host, ``host:<address>``, stands in (every process of one host is then one writer).
Processes that share a certificate share their blocks' ownership.
"""

from __future__ import annotations

import grpc.aio


def caller_of(context: grpc.aio.ServicerContext) -> str:
    auth = context.auth_context() or {}
    names = auth.get("x509_common_name") or ()
    if names:
        return "cn:" + names[0].decode(errors="replace")
    return "host:" + peer_host(context.peer() or "")


def peer_host(peer: str) -> str:
    """``ipv4:127.0.0.1:5000`` → ``127.0.0.1``, ``ipv6:[::1]:5000`` → ``[::1]``; others (``unix:...``)
    whole."""
    kind, _, address = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        return address.rpartition(":")[0] or address
    return peer

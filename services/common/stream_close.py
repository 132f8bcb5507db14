"""How a decode node's ``Attach`` call ended, as the gateway reads it.

A call the node itself ended with an error (the request is unknown there, another ``Attach`` took over,
the node's engine failed, ``resume_after`` out of range) carries the trailing metadata key
:data:`ATTACH_FINAL`: attaching again would get the same answer. A call that broke (a lost connection, a
keepalive timeout, a process that stood still) carries none, and the gateway attaches again with
``resume_after``.
"""

from __future__ import annotations

from typing import Any

ATTACH_FINAL = "pdserve-attach-final"


def ended_by_node(trailing_metadata: Any) -> bool:
    """Whether a failed call's trailing metadata (``grpc.aio.AioRpcError.trailing_metadata()``; may be None)
    says the node ended it itself."""
    return any(key == ATTACH_FINAL for key, _ in (trailing_metadata or ()))

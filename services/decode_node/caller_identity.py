"""Who is calling, as the decode node's per-caller bounds and grants see it (``caller_of`` is
``services.common.tls.roles.caller_name``), and which callers need a grant token to abort.

A caller is the process behind the call: the common name of its verified certificate (one per process,
e.g. ``cn:prefill-1``), else, on a plaintext port (``--insecure``), the peer's host (``host:10.0.0.7``; all
processes of one host are then one caller). The prefixes keep a host from posing as a common name.
"""

from __future__ import annotations

import grpc.aio

from services.common.tls.roles import caller_roles

TOKEN_FREE_ROLES = frozenset({"gateway", "decode"})
"""Roles that may abort any request on a decode node without its grant token."""


def needs_grant_token(context: grpc.aio.ServicerContext) -> bool:
    """A caller whose certificate names prefill and neither gateway nor decode: its ``Abort`` must carry the
    request's grant token. On a plaintext port (no roles) nothing is required: there is no identity."""
    roles = caller_roles(context)
    return "prefill" in roles and not roles & TOKEN_FREE_ROLES

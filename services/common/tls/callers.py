"""Who may call what, in one table: the roles each internal RPC accepts (checked by ``roles.RoleCheck``).

The roles follow the life of a request (DESIGN.md): the gateway starts and ends requests on the nodes; a
prefill node reserves on a decode node and streams KV into the grant it got; a decode node hands running
requests over to a peer (``Adopt``), and so does a gateway whose decode node failed mid-stream (as tokens
only, to be recomputed: the decode node refuses it anything else); both node kinds read and write the
cache-store. ``NodeStatus``,
health and reflection are read-only and open to every role; ``Admin`` only to ``admin``.
"""

from __future__ import annotations

from services.common.tls.roles import ANY_ROLE, RolePolicy

GATEWAY, PREFILL, DECODE = ("gateway",), ("prefill",), ("decode",)
NODES = ("prefill", "decode")

CALLERS: dict[str, tuple[str, ...]] = {
    "pdserve.v1.PrefillNode/Prefill": GATEWAY,
    "pdserve.v1.PrefillNode/Abort": GATEWAY,
    "pdserve.v1.PrefillNode/Embed": GATEWAY,
    "pdserve.v1.PrefillNode/NodeStatus": ANY_ROLE,
    "pdserve.v1.DecodeNode/Reserve": PREFILL,
    "pdserve.v1.DecodeNode/TransferKV": PREFILL,
    "pdserve.v1.DecodeNode/OpenKVIpc": PREFILL,
    "pdserve.v1.DecodeNode/Attach": GATEWAY,
    "pdserve.v1.DecodeNode/Abort": ("gateway", "prefill", "decode"),
    "pdserve.v1.DecodeNode/Adopt": ("decode", "gateway"),
    "pdserve.v1.DecodeNode/NodeStatus": ANY_ROLE,
    "pdserve.v1.CacheStore/Put": NODES,
    "pdserve.v1.CacheStore/Delete": NODES,
    "pdserve.v1.CacheStore/Get": NODES,
    "pdserve.v1.CacheStore/Lookup": ("gateway", *NODES),
    "pdserve.v1.CacheStore/NodeStatus": ANY_ROLE,
    # the public API: served on the gateway's own port without role checks (API keys there); a Gateway
    # service behind an internal port (a test's) takes any cluster identity
    "pdserve.v1.Gateway": ANY_ROLE,
}

INTERNAL_POLICY = RolePolicy(CALLERS)

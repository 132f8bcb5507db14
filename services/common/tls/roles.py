"""Which roles may call which method: every internal RPC checks its caller's certificate.

A service declares its callers as a mapping from a full method name (``pdserve.v1.DecodeNode/Reserve``)
or a whole service (``grpc.health.v1.Health``) to roles. :class:`RoleCheck` wraps every handler: the
caller's roles are the ``spiffe://pdserve/<role>`` URI SANs of the certificate it presented (the TLS
handshake already verified it against the cluster CA). A method no rule names is refused: a new RPC
is closed until someone says who may call it.

- a certificate that names no pdserve role → ``UNAUTHENTICATED``;
- a role the method does not accept → ``PERMISSION_DENIED`` naming the method, the caller's roles and
  the accepted ones;
- each (caller, method) refusal is logged once (``caller_name``: the certificate's common name, or the
  peer's host), not per call.

A caller without a certificate never gets this far: the mTLS handshake fails (it sees ``UNAVAILABLE``).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import grpc
import grpc.aio
import structlog
from grpc_health.v1 import health
from grpc_reflection.v1alpha import reflection

from services.common.tls.ca import ROLES, SPIFFE_PREFIX

log = structlog.get_logger(__name__)

ANY_ROLE = ROLES
MAX_LOGGED_REFUSALS = 4096  # distinct (caller, method) refusals logged; past it, no more lines (a flood)
ADMIN_SERVICE = "pdserve.v1.Admin"
# what every pdserve server accepts besides its own services
COMMON_CALLERS: dict[str, tuple[str, ...]] = {
    health.SERVICE_NAME: ANY_ROLE,
    reflection.SERVICE_NAME: ANY_ROLE,
    "grpc.reflection.v1.ServerReflection": ANY_ROLE,
    ADMIN_SERVICE: ("admin",),
}


def caller_roles(context: grpc.aio.ServicerContext) -> frozenset[str]:
    """The pdserve roles of the caller's verified certificate (empty on a plaintext port)."""
    auth = context.auth_context() or {}
    uris = [u.decode(errors="replace") for u in auth.get("peer_uri", ())]
    return frozenset(u.removeprefix(SPIFFE_PREFIX) for u in uris if u.startswith(SPIFFE_PREFIX))


def caller_name(context: grpc.aio.ServicerContext) -> str:
    """Who is calling: the process behind the call, for per-caller bounds, a block's writer and logs.

    On an mTLS port, the common name of the caller's verified certificate — one per process (``prefill-1``,
    ``decode-2``: ``services.cluster`` issues them so), stable across rotation and restarts — as
    ``cn:<name>``. On a plaintext port (``--insecure``) the peer's host, ``host:<address>`` (every process
    of one host is then one caller). The prefixes keep a host from posing as a common name; processes that
    share a certificate are one caller."""
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


class RolePolicy:
    def __init__(self, callers: Mapping[str, Iterable[str]]) -> None:
        """``callers``: method (``pkg.Service/Method``) or service (``pkg.Service``) → roles; the common
        services (health, reflection: any role; Admin: admin) are added."""
        rules = {**COMMON_CALLERS, **{k: tuple(v) for k, v in callers.items()}}
        unknown = {r for roles in rules.values() for r in roles} - set(ROLES)
        if unknown:
            raise ValueError(f"unknown roles {sorted(unknown)} (roles: {ROLES})")
        self._rules = {name: frozenset(roles) for name, roles in rules.items()}

    def accepted(self, method: str) -> frozenset[str]:
        """The roles that may call ``method`` (``/pkg.Service/Method`` or ``pkg.Service/Method``); empty
        when no rule names it."""
        name = method.lstrip("/")
        service = name.partition("/")[0]
        return self._rules.get(name, self._rules.get(service, frozenset()))


class RoleCheck(grpc.aio.ServerInterceptor):
    def __init__(self, policy: RolePolicy) -> None:
        self.policy = policy
        self._logged: set[tuple[str, str]] = set()  # (caller, method) refusals already logged

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(details)
        if handler is None:
            return None
        method = details.method.lstrip("/")
        return _guarded(handler, lambda context: self._refusal(method, context))

    def _refusal(self, method: str, context: grpc.aio.ServicerContext) -> tuple[grpc.StatusCode, str] | None:
        roles = caller_roles(context)
        accepted = self.policy.accepted(method)
        if roles & accepted:
            return None
        if not roles:
            refusal = (grpc.StatusCode.UNAUTHENTICATED,
                       f"{method}: the caller's certificate names no pdserve role ({SPIFFE_PREFIX}<role>)")
        else:
            refusal = (grpc.StatusCode.PERMISSION_DENIED,
                       f"{method}: a caller with role {'/'.join(sorted(roles))} may not call it "
                       f"(accepted: {', '.join(sorted(accepted)) or 'none'})")
        caller = caller_name(context)
        if (caller, method) not in self._logged and len(self._logged) < MAX_LOGGED_REFUSALS:
            self._logged.add((caller, method))
            log.warning("caller refused", method=method, caller=caller, roles=sorted(roles), peer=context.peer(),
                        code=refusal[0].name)
        return refusal


Check = Callable[[grpc.aio.ServicerContext], "tuple[grpc.StatusCode, str] | None"]


def _guarded(handler: grpc.RpcMethodHandler, check: Check) -> grpc.RpcMethodHandler:
    """``handler`` with ``check`` run before its behaviour (an async generator stays one)."""
    field = {(False, False): "unary_unary", (False, True): "unary_stream",
             (True, False): "stream_unary", (True, True): "stream_stream"}[
        (handler.request_streaming, handler.response_streaming)]
    behavior = getattr(handler, field)

    if inspect.isasyncgenfunction(behavior):
        async def guarded_stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
            refusal = check(context)
            if refusal is not None:
                await context.abort(*refusal)
            async for item in behavior(request, context):
                yield item

        return handler._replace(**{field: guarded_stream})  # type: ignore[attr-defined]

    async def guarded(request: Any, context: grpc.aio.ServicerContext) -> Any:
        refusal = check(context)
        if refusal is not None:
            await context.abort(*refusal)
        result = behavior(request, context)
        return await result if inspect.isawaitable(result) else result

    return handler._replace(**{field: guarded})  # type: ignore[attr-defined]

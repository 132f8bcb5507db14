"""Which roles may call which method: every internal RPC checks its caller's certificate.

A service declares its callers as a mapping from a full method name (``pdserve.v1.DecodeNode/Reserve``)
or a whole service (``grpc.health.v1.Health``) to roles. :class:`RoleCheck` wraps every handler: the
caller's roles are the ``spiffe://pdserve/<role>`` URI SANs of the certificate it presented (the TLS
handshake already verified it against the cluster CA). A method no rule names is refused: a new RPC
is closed until someone says who may call it.

- a certificate that names no pdserve role → ``UNAUTHENTICATED``;
- a role the method does not accept → ``PERMISSION_DENIED`` naming the method, the caller's roles and
  the accepted ones;
- each (peer roles, method) refusal is logged once, not per call.

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
        self._logged: set[tuple[frozenset[str], str]] = set()

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
        if (roles, method) not in self._logged:
            self._logged.add((roles, method))
            log.warning("caller refused", method=method, roles=sorted(roles), peer=context.peer(),
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

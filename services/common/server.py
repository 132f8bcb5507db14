"""gRPC server bootstrap shared by every service: health, reflection, binding, signals, graceful drain.

A service's ``main.py`` builds its servicers, wraps them in ``ServiceBinding``s and runs::

    server = NodeServer(bindings, listen=config.listen, drain=servicer.drain, grace_s=config.grace_s)
    await server.start()                # binds (port 0 → ephemeral), marks SERVING, writes the port file
    await server.serve_until_signalled()  # SIGTERM/SIGINT → graceful drain → return

from inside ``run(...)`` (uvloop). Shutdown order: health turns NOT_SERVING (load balancers and the
gateway stop routing here), the service's ``drain()`` hook runs (stop taking work, finish or abort
in-flight requests, release their blocks), then ``server.stop(grace_s)`` ends what is left. A second
signal cuts the drain short and stops without grace. Construct ``NodeServer`` inside the running loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
import grpc.aio
import structlog
import uvloop
from google.protobuf.descriptor import ServiceDescriptor
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from pdserve.v1 import admin_pb2, admin_pb2_grpc
from prometheus_client import CollectorRegistry

from services.common import keepalive
from services.common.admin import AdminServicer, RebalanceHook
from services.common.loop_watchdog import LoopWatchdog, StallCollector
from services.common.metrics import MetricsEndpoint
from services.common.request_parsing import TolerantParsing
from services.common.server_config import DEFAULT_MAX_MESSAGE_BYTES, ServerConfig
from services.common.side_ports import start_side_port
from services.common.tls.callers import INTERNAL_POLICY
from services.common.tls.channels import current_identity
from services.common.tls.identity import Identity
from services.common.tls.roles import RoleCheck
from services.engine.errors import EngineError

log = structlog.get_logger(__name__)

IGNORE_SIGINT = "PDSERVE_IGNORE_SIGINT"
"""Set to 1 by a launcher (``services.common.launch``) in its services' environment: they ignore SIGINT."""


def ignore_sigint_if_launched() -> None:
    """A launcher's service ignores SIGINT: a terminal's Ctrl-C reaches the whole foreground process group, and
    the launcher stops its services itself, in order, with one SIGTERM each; a SIGINT of their own would be a
    second stop request, which skips the rest of a drain."""
    if os.environ.get(IGNORE_SIGINT) == "1":
        signal.signal(signal.SIGINT, signal.SIG_IGN)



ADMIN_SERVICE = admin_pb2.DESCRIPTOR.services_by_name["Admin"].full_name

DrainHook = Callable[[], Awaitable[None]]
T = TypeVar("T")


def grpc_options(max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> list[tuple[str, Any]]:
    """Channel/server options every pdserve endpoint uses (clients pass them to their channels too).

    Channels reconnect to a peer that went away after 100 ms, then at most every second (gRPC's default
    starts at 1 s and grows to 120 s): a restarted node is reached again within a second, where a caller
    would otherwise read ``UNAVAILABLE: Connection refused`` for seconds after it is back. (Not
    ``min_reconnect_backoff_ms``: gRPC reads it as each connection attempt's timeout, 20 s by default.)"""
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1000),
        *keepalive.options(),
    ]


@dataclass(frozen=True)
class ServiceBinding:
    """One servicer to register: its proto service descriptor, the servicer and the generated adder."""

    descriptor: ServiceDescriptor
    servicer: object
    add_to_server: Callable[[Any, grpc.aio.Server], None]

    @property
    def name(self) -> str:
        return self.descriptor.full_name


class NodeServer:
    """A ``grpc.aio`` server with health, reflection and a signal-driven graceful shutdown."""

    def __init__(
        self,
        bindings: Sequence[ServiceBinding],
        *,
        listen: str,
        drain: DrainHook | None = None,
        grace_s: float = 5.0,
        drain_timeout_s: float = 30.0,
        port_file: Path | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        max_receive_bytes: int | None = None,
        metrics: MetricsEndpoint | None = None,
        interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
        watchdog: LoopWatchdog | None = None,
        identity: Identity | bool | None = True,
        public_credentials: grpc.ServerCredentials | bool | None = False,
        health_listen: str = "",
        admin_listen: str = "",
    ) -> None:
        """``metrics``: the Prometheus endpoint to serve from ``start()`` until the shutdown ends;
        ``max_receive_bytes``: the largest message a client may send, when less than ``max_message_bytes``
        (the gateway's requests are small: a larger one is refused before it is parsed); ``watchdog``:
        watches the event loop from ``start()`` until the shutdown ends (default: a new one), its counts on
        the metrics endpoint.

        Ports (see ``side_ports``): the main port is internal — mTLS with ``identity`` (True: the process's,
        ``tls.channels``; None: plaintext) and every call's caller role checked (``tls.callers``) — unless
        ``public_credentials`` is given (the gateway: None = plaintext, or its public TLS): then it has no
        role check and no ``Admin``, which ``admin_listen`` serves instead. ``health_listen``: a plaintext
        health-only port."""
        self.bindings = list(bindings)
        self._set_ports(identity, public_credentials, health_listen, admin_listen)
        self.metrics = metrics
        self.listen = listen
        self.grace_s = grace_s
        self.drain_timeout_s = drain_timeout_s
        self.port_file = port_file
        self.port: int | None = None
        self.health = health.aio.HealthServicer()
        self.watchdog = watchdog or LoopWatchdog()
        if metrics is not None:
            with contextlib.suppress(ValueError):  # a registry that already has them (a server built anew)
                metrics.registry.register(StallCollector(self.watchdog))
        self._drain = drain
        self.rebalance: RebalanceHook | None = None  # Admin/Rebalance (a decode node's; set before start())
        # No SO_REUSEPORT: a second node on a taken port must fail to bind, not silently share it.
        options = dict(grpc_options(max_message_bytes))
        if max_receive_bytes is not None:
            options["grpc.max_receive_message_length"] = min(max_receive_bytes, max_message_bytes)
        self._options = list(options.items())
        checks = [RoleCheck(INTERNAL_POLICY)] if self.identity is not None and not self.public else []
        self._server = grpc.aio.server(options=[*self._options, ("grpc.so_reuseport", 0)],
                                       interceptors=[*checks, TolerantParsing(), *interceptors])
        self._stop_requested = asyncio.Event()
        self._force = asyncio.Event()
        self._shutdown_task: asyncio.Task[None] | None = None

    def _set_ports(self, identity: Identity | bool | None, public_credentials: grpc.ServerCredentials | bool | None,
                   health_listen: str, admin_listen: str) -> None:
        self.identity = current_identity() if identity is True else (identity or None)
        self.public = public_credentials is not False
        self._credentials = (public_credentials or None) if self.public else (
            self.identity.server_credentials() if self.identity is not None else None)
        self.health_listen = health_listen
        self.admin_listen = admin_listen
        self.health_port: int | None = None
        self.admin_port: int | None = None
        self._side_servers: list[grpc.aio.Server] = []

    @classmethod
    def from_config(
        cls, config: ServerConfig, bindings: Sequence[ServiceBinding], drain: DrainHook | None = None,
        registry: CollectorRegistry | None = None, max_receive_bytes: int | None = None,
        watchdog: LoopWatchdog | None = None, interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
        public_credentials: grpc.ServerCredentials | bool | None = False, admin_listen: str = "",
    ) -> NodeServer:
        """``registry``: served at ``config.metrics_listen`` (none when that is empty); the identity is the
        process's (set by ``run_service`` from the config)."""
        metrics = None
        if registry is not None and config.metrics_listen:
            metrics = MetricsEndpoint(registry, config.metrics_listen)
        return cls(bindings, listen=config.listen, drain=drain, grace_s=config.grace_s,
                   drain_timeout_s=config.drain_timeout_s, port_file=config.port_file,
                   max_message_bytes=config.max_message_mib << 20, max_receive_bytes=max_receive_bytes,
                   metrics=metrics, watchdog=watchdog, interceptors=interceptors,
                   public_credentials=public_credentials, health_listen=config.health_listen,
                   admin_listen=admin_listen)

    @property
    def service_names(self) -> list[str]:
        """Every registered service, admin, health and reflection included (what reflection lists)."""
        admin = [] if self.public else [ADMIN_SERVICE]  # a public port serves no Admin (the admin port does)
        return [*(b.name for b in self.bindings), *admin, health.SERVICE_NAME, reflection.SERVICE_NAME]

    @property
    def stopping(self) -> bool:
        """A drain (signal or ``Admin/Drain``) has been asked for."""
        return self._stop_requested.is_set()

    @property
    def address(self) -> str:
        assert self.port is not None, "server not started"
        return f"{self.listen.rpartition(':')[0]}:{self.port}"

    def metrics_url(self, advertise: str = "") -> str:
        """The Prometheus endpoint's URL (``advertise``: the address peers reach this node at, whose host
        replaces a wildcard bind host); empty when there is none."""
        return self.metrics.url(advertise or self.address) if self.metrics is not None and self.metrics.port else ""

    async def start(self, serving: bool = True) -> int:
        """Register everything, bind, start; returns the bound port. ``serving=False`` starts NOT_SERVING
        (a node still loading its model); call ``set_serving(True)`` when ready."""
        for binding in self.bindings:
            binding.add_to_server(binding.servicer, self._server)
        if not self.public:
            self._add_admin(self._server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        reflection.enable_server_reflection(self.service_names, self._server)
        try:
            port = (self._server.add_secure_port(self.listen, self._credentials) if self._credentials is not None
                    else self._server.add_insecure_port(self.listen))
        except RuntimeError as error:  # grpc raises on a failed bind (older versions returned 0)
            await self._server.stop(None)
            raise OSError(f"cannot bind {self.listen}: {error}") from error
        if port == 0:
            await self._server.stop(None)
            raise OSError(f"cannot bind {self.listen}")
        self.port = port
        await self._server.start()  # before the metrics endpoint: a started grpc.aio server stops cleanly
        try:
            await self._start_side_ports()
        except OSError:
            await self._stop_servers(None)
            raise
        if self.metrics is not None:
            try:
                self.metrics.start()
            except OSError as error:
                await self._stop_servers(None)
                raise OSError(f"cannot bind the metrics endpoint {self.metrics.host}:{self.metrics.requested_port}: "
                              f"{error}") from error
        await self.set_serving(serving)
        if self.port_file is not None:
            write_port_file(self.port_file, port)
        self.watchdog.start()
        log.info("serving", address=self.address, services=[b.name for b in self.bindings],
                 metrics=self.metrics_url(), mtls=self.identity is not None and not self.public,
                 health_port=self.health_port, admin_port=self.admin_port)
        return port

    def _add_admin(self, server: grpc.aio.Server) -> None:
        admin_pb2_grpc.add_AdminServicer_to_server(
            AdminServicer(self.request_stop, lambda: self.stopping, lambda: self.rebalance), server)

    async def _start_side_ports(self) -> None:
        def add_health(server: grpc.aio.Server) -> None:
            health_pb2_grpc.add_HealthServicer_to_server(self.health, server)

        if self.health_listen:
            server, self.health_port = await start_side_port(self.health_listen, [add_health], None)
            self._side_servers.append(server)
        if self.admin_listen and self.public:
            credentials = self.identity.server_credentials() if self.identity is not None else None
            checks = [RoleCheck(INTERNAL_POLICY)] if self.identity is not None else []
            server, self.admin_port = await start_side_port(self.admin_listen, [self._add_admin, add_health],
                                                            credentials, checks, self._options)
            self._side_servers.append(server)

    async def _stop_servers(self, grace: float | None) -> None:
        for server in [self._server, *self._side_servers]:
            await server.stop(grace)

    async def set_serving(self, serving: bool) -> None:
        """Overall ("") and per-service health; ignored once shutdown began."""
        statuses = health_pb2.HealthCheckResponse
        status = statuses.SERVING if serving else statuses.NOT_SERVING
        for name in ("", *(b.name for b in self.bindings)):
            await self.health.set(name, status)

    def request_stop(self) -> None:
        """What a signal does: the first asks for a graceful shutdown, the next one forces it."""
        if self._stop_requested.is_set():
            log.warning("second stop request: skipping the rest of the drain")
            self._force.set()
        self._stop_requested.set()

    async def serve_until_signalled(self) -> None:
        """Serve until SIGTERM/SIGINT (or ``request_stop``), then shut down gracefully."""
        global _started
        _started = True  # past startup: what fails from now on is reported with its traceback (run())
        loop = asyncio.get_running_loop()
        # a launcher's service leaves SIGINT ignored (ignore_sigint_if_launched); any other takes it, even when
        # started with it ignored (a background job of a shell, make's children)
        signals = [signal.SIGTERM] + ([] if os.environ.get(IGNORE_SIGINT) == "1" else [signal.SIGINT])
        for sig in signals:
            loop.add_signal_handler(sig, self.request_stop)
        try:
            await self._stop_requested.wait()
            await self.shutdown()
        finally:
            for sig in signals:
                loop.remove_signal_handler(sig)

    async def shutdown(self) -> None:
        """NOT_SERVING → drain hook (bounded by ``drain_timeout_s``) → ``stop(grace_s)``. Idempotent."""
        if self._shutdown_task is None:
            self._shutdown_task = asyncio.ensure_future(self._shutdown())
        await asyncio.shield(self._shutdown_task)

    async def _shutdown(self) -> None:
        log.info("draining", address=self.address if self.port else self.listen)
        await self.health.enter_graceful_shutdown()
        try:
            if self._drain is not None:
                await self._run_drain(self._drain)
        finally:
            await self._stop_servers(0 if self._force.is_set() else self.grace_s)
            self.watchdog.stop()
            if self.metrics is not None:
                await asyncio.to_thread(self.metrics.stop)
            log.info("stopped", forced=self._force.is_set())

    async def _run_drain(self, drain: DrainHook) -> None:
        task = asyncio.ensure_future(drain())
        forced = asyncio.ensure_future(self._force.wait())
        done, _ = await asyncio.wait({task, forced}, timeout=self.drain_timeout_s,
                                     return_when=asyncio.FIRST_COMPLETED)
        forced.cancel()
        if task not in done:
            log.warning("drain cut short", reason="forced" if self._force.is_set() else "timeout")
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            return
        task.result()  # a drain hook that failed is a bug: let it surface


def write_port_file(path: Path, port: int) -> None:
    """Atomically write ``port`` so a reader never sees a partial file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(f"{port}\n")
    tmp.replace(path)


_started = False  # a NodeServer of this process began serving (serve_until_signalled)


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run a service's async main on uvloop. What fails at startup and says what is wrong in its message (a
    port in use, a model file that cannot be read, a setting the engine refuses) ends the process with that
    one line on stderr and exit code 1 (its traceback is logged at debug level); once serving, a failure
    keeps its traceback."""
    try:
        return uvloop.run(main)
    except (OSError, ValueError, EngineError) as error:
        if _started:
            raise
        log.debug("startup failed", exc_info=True)
        sys.stderr.write(f"error: {error}\n")
        raise SystemExit(1) from None

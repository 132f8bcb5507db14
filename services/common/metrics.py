"""Prometheus metrics shared by every service: one registry per server, its HTTP endpoint, scrape-time reads.

Each process serves Prometheus text at ``http://<metrics_listen>/metrics`` from a thread of its own
(:class:`MetricsEndpoint`), over a :class:`prometheus_client.CollectorRegistry` owned by that server
(tests run several servers in one process). Node-level numbers are not kept twice: a
:class:`LoopCollector` reads them at scrape time by running the service's status coroutine on its event
loop (where that state lives) and turns the answer into metric families, so the request path pays nothing.
Request-level histograms (the gateway's) are ordinary ``prometheus_client`` metrics on the same registry.

Names start with ``pdserve_`` and carry their unit (``_seconds``, ``_bytes``, ``_blocks``, ``_total``);
no label carries anything per request.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import socket
import socketserver
import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator
from importlib import metadata
from typing import Generic, TypeVar
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import structlog
from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

log = structlog.get_logger(__name__)

T = TypeVar("T")
WILDCARD_HOSTS = ("0.0.0.0", "::", "[::]", "")


def new_registry(role: str) -> CollectorRegistry:
    """A registry with ``pdserve_build_info{role, version}`` and the process collector (CPU, memory, fds)."""
    registry = CollectorRegistry()
    registry.register(_BuildInfo(role))
    ProcessCollector(registry=registry)
    return registry


class _BuildInfo(Collector):
    def __init__(self, role: str) -> None:
        try:
            version = metadata.version("pdserve")
        except metadata.PackageNotFoundError:
            version = "unknown"
        self._labels = {"role": role, "version": version}

    def collect(self) -> Iterator[Metric]:
        info = InfoMetricFamily("pdserve_build", "What this process is: its role and pdserve version")
        info.add_metric([], self._labels)
        yield info


# --- scrape-time reads of event-loop state -------------------------------------------------------------


class LoopCollector(Collector, Generic[T]):
    """Families rendered at scrape time from ``read()``, a coroutine run on ``loop`` (the service's event
    loop, which owns the state) from the scraping thread, bounded by ``timeout_s``.

    A read that fails or times out (a loop stuck or shutting down) yields ``pdserve_status_up 0`` and
    nothing else from this collector; the scrape itself still answers. Never call ``collect`` on the
    loop's own thread: it would wait for itself (it raises instead).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, read: Callable[[], Awaitable[T]],
                 render: Callable[[T], Iterable[Metric]], timeout_s: float = 5.0) -> None:
        self.loop = loop
        self.read = read
        self.render = render
        self.timeout_s = timeout_s

    def describe(self) -> list[Metric]:
        return []  # registering must not run a read (it may happen on the loop thread)

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("pdserve_status_up", "1 when this process's node status could be read at scrape")
        try:
            value = self._read()
        except (concurrent.futures.TimeoutError, RuntimeError, OSError) as error:
            log.warning("metrics: status read failed", error=repr(error))
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from self.render(value)

    def _read(self) -> T:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            raise AssertionError("LoopCollector.collect called on its own event loop: it would deadlock")

        async def read() -> T:
            return await self.read()

        future = asyncio.run_coroutine_threadsafe(read(), self.loop)
        try:
            return future.result(self.timeout_s)
        finally:
            future.cancel()


def gauge(name: str, documentation: str, value: float, **labels: str) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, documentation, labels=list(labels))
    family.add_metric(list(labels.values()), value)
    return family


def counter(name: str, documentation: str, value: float, **labels: str) -> CounterMetricFamily:
    family = CounterMetricFamily(name, documentation, labels=list(labels))
    family.add_metric(list(labels.values()), value)
    return family


def labelled(family: GaugeMetricFamily | CounterMetricFamily, label: str,
             values: Iterable[tuple[str, float]]) -> GaugeMetricFamily | CounterMetricFamily:
    """``family`` (made with ``labels=[label]``) with one sample per (label value, value)."""
    for label_value, value in values:
        family.add_metric([label_value], value)
    return family


# --- the HTTP endpoint ----------------------------------------------------------------------------------


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


class MetricsEndpoint:
    """``GET /metrics`` of ``registry`` on ``listen`` (host:port, port 0 = ephemeral), from a thread.

    ``start()`` binds (``OSError`` if it cannot) and serves; ``stop()`` closes it (idempotent, < 0.1 s).
    """

    def __init__(self, registry: CollectorRegistry, listen: str) -> None:
        host, _, port = listen.rpartition(":")
        self.registry = registry
        self.host = host.strip("[]")
        self.requested_port = int(port)
        self.port: int | None = None
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> int:
        server = make_server(self.host, self.requested_port, make_wsgi_app(self.registry),
                             _Server6 if ":" in self.host else _Server,
                             handler_class=_QuietHandler)
        self._server = server
        self.port = server.server_port
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"metrics:{self.port}", daemon=True)
        self._thread.start()
        return self.port

    def stop(self) -> None:
        server, thread, self._server, self._thread = self._server, self._thread, None, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join()

    def url(self, advertise: str = "") -> str:
        """``http://host:port/metrics``. A wildcard bind host (0.0.0.0, ::) is replaced by the host of
        ``advertise`` (the node's advertised gRPC ``host:port``), or by this machine's address."""
        assert self.port is not None, "metrics endpoint not started"
        return f"http://{_url_host(advertised_host(self.host, advertise))}:{self.port}/metrics"


def advertised_host(bind_host: str, advertise: str = "") -> str:
    """The host others reach a server bound on ``bind_host`` at (see :meth:`MetricsEndpoint.url`)."""
    if bind_host not in WILDCARD_HOSTS:
        return bind_host
    host = advertise.rpartition(":")[0].strip("[]") if advertise else ""
    if host not in WILDCARD_HOSTS:
        return host
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
